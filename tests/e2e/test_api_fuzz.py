"""The gateway fuzzed from its own OpenAPI schema (Schemathesis), through real processes:
``framefleet api`` under uvicorn, a Celery worker with the tiny model, Redis and SeaweedFS.

Every operation the schema lists gets a bounded number of generated requests (``EXAMPLES``
each, valid and invalid ones, deterministic), with a key. Each response must be:

- never a server error (``not_a_server_error``);
- a status, a content type and a body the schema documents (``status_code_conformance``,
  ``content_type_conformance``, ``response_schema_conformance``);
- for any 4xx, the one error shape ``{"error": {"message", "type", "param", "code"}}``, whose
  400s name the field at fault (``error_shape`` below).

Generated bodies may carry webhook URLs to public hosts: the gateway must refuse them (the
fleet's allow-list, empty by default) before any request leaves this machine, so the fuzz
sends nothing beyond loopback.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import CheckContext, not_a_server_error
from schemathesis.core.transport import Response
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.e2e.api_fleet import ApiFleet, api_fleet  # noqa: F401 - api_fleet is the fixture

pytestmark = pytest.mark.e2e
#: Generated requests per operation and mode: ten operations take about a minute on two cores.
EXAMPLES = int(os.environ.get("FRAMEFLEET_FUZZ_EXAMPLES", "25"))
ERROR_TYPES = {"invalid_request_error", "authentication_error", "permission_error",
               "rate_limit_error", "server_error"}


def error_shape(ctx: CheckContext, response: Response, case: Any) -> bool | None:
    """A 4xx carries the one error shape; a 400 names the field (``param``)."""
    if not 400 <= response.status_code < 500 or case.method.upper() == "HEAD":
        return None
    body = response.json()
    assert isinstance(body, dict) and set(body) == {"error"}, f"not the error shape: {body}"
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, f"error fields: {error}"
    assert error["type"] in ERROR_TYPES, error
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["code"], str) and error["code"], error
    if response.status_code == 400:
        assert isinstance(error["param"], str) and error["param"], f"400 names no field: {error}"
    return True


def test_the_gateway_keeps_its_schema(api_fleet: ApiFleet) -> None:  # noqa: F811
    schema = schemathesis.openapi.from_url(api_fleet.gateway.url + "/openapi.json")
    headers = api_fleet.keys["acme"].headers
    checks = [not_a_server_error, status_code_conformance, content_type_conformance,
              response_schema_conformance, error_shape]
    failures: list[str] = []
    report: list[str] = []
    # Schemathesis's own pytest loader (from_fixture) does not run under pytest 9: its
    # strategies, driven by Hypothesis here, per operation and generation mode.
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            statuses: Counter[int] = Counter()
            found = [0]

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                      suppress_health_check=list(HealthCheck), phases=[Phase.generate])
            def run(case: Any) -> None:
                try:
                    response = case.call_and_validate(headers=headers, timeout=30,
                                                      checks=checks)
                    statuses[response.status_code] += 1
                except (Exception, BaseExceptionGroup) as e:  # noqa: BLE001 - reported below
                    found[0] += 1
                    if found[0] > 1:
                        return  # the first of an operation's failures is enough to read
                    failures.append(f"{operation.label} [{mode.value}]: "
                                    f"{' '.join(str(e).split())[:600]}\n  {case.as_curl_command()}")

            run()
            report.append(f"{operation.label} [{mode.value}]: {dict(sorted(statuses.items()))}")
    print("\n".join(report))
    print(f"{len(report)} operation modes, {len(failures)} failures")
    assert not failures, "\n".join(failures[:20])
