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

import http.client
import os
from collections import Counter
from pathlib import Path
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

from tests.e2e.api_fleet import (  # noqa: F401 - api_fleet is the fixture
    ApiFleet,
    api_fleet,
    call,
    post_json,
    replica,
)

pytestmark = pytest.mark.e2e
#: Generated requests per operation and mode: ten operations take about a minute on two cores.
EXAMPLES = int(os.environ.get("FRAMEFLEET_FUZZ_EXAMPLES", "25"))
#: Rate limits a fuzz cannot reach (the settings' largest).
UNBOUNDED = "1000000"
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


def fuzz(operation: Any, mode: GenerationMode, headers: dict[str, str]) -> tuple[str, str | None]:
    """``EXAMPLES`` generated requests of one operation in one mode: (the statuses seen, the
    first failure or None)."""
    statuses: Counter[int] = Counter()
    failures: list[str] = []

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate])
    def run(case: Any) -> None:
        try:
            response = case.call_and_validate(headers=headers, timeout=30, checks=CHECKS)
            statuses[response.status_code] += 1
        except (Exception, BaseExceptionGroup) as e:  # noqa: BLE001 - reported by the caller
            if not failures:  # the first of an operation's failures is enough to read
                failures.append(f"{' '.join(str(e).split())[:800]}\n  {case.as_curl_command()}")

    run()
    return str(dict(sorted(statuses.items()))), (failures[0] if failures else None)


CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance, error_shape]


def test_the_gateway_keeps_its_schema(api_fleet: ApiFleet, tmp_path: Path) -> None:  # noqa: F811
    # A replica of its own whose rate limits a fuzz does not reach (the limits' windows are
    # per limit, so the fleet's other gateway keeps its own budgets untouched): every request
    # reaches the routes. Schemathesis's own pytest loader (from_fixture) does not run under
    # pytest 9: its strategies are driven by Hypothesis here, per operation and mode.
    with replica(api_fleet, tmp_path, "fuzzed", FRAMEFLEET_API_ANON_RATE_PER_MINUTE=UNBOUNDED,
                 FRAMEFLEET_API_RATE_PER_MINUTE=UNBOUNDED) as gateway:
        report, failures = fuzz_all(gateway.url, api_fleet.keys["acme"].headers)
    print("\n".join(report))
    print(f"{len(report)} operations x modes, {EXAMPLES} examples each, "
          f"{len(failures)} failures")
    assert len(report) == 20  # every operation of the schema, both ways
    assert not failures, "\n".join(failures)


def fuzz_all(url: str, headers: dict[str, str]) -> tuple[list[str], list[str]]:
    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    report, failures = [], []
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            statuses, failure = fuzz(operation, mode, headers)
            report.append(f"{operation.label} [{mode.value}]: {statuses}")
            if failure:
                failures.append(f"{operation.label} [{mode.value}]: {failure}")
    return report, failures


@pytest.mark.parametrize("url", ["https://example.com/hook", "http://93.184.216.34/h",
                                 "https://hooks.example.net:8443/x"])
def test_a_public_webhook_is_refused_before_anything_is_sent(api_fleet: ApiFleet,  # noqa: F811
                                                             url: str) -> None:
    """What a fuzzed body may carry: the default allow-list (empty) refuses every webhook
    host at submit, so no job exists whose worker would try to deliver one."""
    key = api_fleet.keys["acme"]
    status, body = post_json(api_fleet.gateway.url, "/v1/jobs", key, {
        "job_id": "hook-1", "generate": {"model": "tiny", "prompt": "x", "width": 48,
                                         "height": 32, "num_frames": 9,
                                         "num_inference_steps": 2},
        "notify": {"urls": [url]}})
    assert status == 400, body
    assert body["error"]["param"] == "notify.urls[0]", body
    assert call(api_fleet.gateway.url, "/v1/jobs/hook-1", key)[0] == 404


def test_head_through_uvicorn(api_fleet: ApiFleet) -> None:  # noqa: F811
    """HEAD where GET is 200 (RFC 9110 §9.1), on the real server: same status and headers, no
    body, and the connection carries on."""
    key = api_fleet.keys["acme"].headers
    conn = http.client.HTTPConnection("127.0.0.1", api_fleet.gateway.port, timeout=30)
    try:
        for path, headers in [("/", {}), ("/healthz", {}), ("/readyz", {}), ("/metrics", {}),
                              ("/v1/videos", key)]:
            conn.request("GET", path, headers=headers)
            got = conn.getresponse()
            got.read()
            conn.request("HEAD", path, headers=headers)
            head = conn.getresponse()
            assert (got.status, head.status, head.read()) == (200, 200, b""), path
            assert head.getheader("Content-Type") == got.getheader("Content-Type"), path
        conn.request("PUT", "/v1/videos", headers=key)
        r = conn.getresponse()
        r.read()
        assert (r.status, r.getheader("Allow")) == (405, "GET, HEAD, POST")
    finally:
        conn.close()
