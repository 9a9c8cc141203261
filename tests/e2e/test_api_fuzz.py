"""The gateway fuzzed from its own OpenAPI schema (Schemathesis), through real processes:
``framefleet api`` under uvicorn, Redis and SeaweedFS.

Every operation the schema lists gets a bounded number of generated requests (``EXAMPLES``
each, valid and invalid ones, deterministic), with a key. The schema must say exactly what the
gateway accepts, both ways:

- a request the schema calls valid is accepted (``positive_data_acceptance``: 2xx; a 404 only
  for an id that names nothing, which no schema can know), and one it calls invalid is refused
  (``negative_data_rejection``: 400, or 401/404/413 where that is the fault);
- a request without the key is a 401 (``ignored_auth``);
- never a server error, and a status, content type, headers and body as documented
  (``not_a_server_error``, ``status_code_conformance``, ``content_type_conformance``,
  ``response_headers_conformance``, ``response_schema_conformance``);
- for any 4xx, the one error shape ``{"error": {"message", "type", "param", "code"}}``, whose
  400s name the field at fault (``error_shape`` below).

The fuzzed replica has a Redis of its own that no worker reads: its accepted jobs stay queued,
so they cost no CPU and none of them ends. Its rate limits are out of reach and its key may
have as many jobs in flight as the settings allow: a 429 would be the cap on unfinished jobs
(``FRAMEFLEET_API_MAX_IN_FLIGHT``, 16 by default), not the rate limit. That was the 429s
of earlier runs, whose jobs one worker ran more slowly than the fuzz sent them.

Generated bodies may carry webhook URLs: the fleet's allow-list names one loopback address,
and the gateway refuses any other before any request leaves this machine.
"""

from __future__ import annotations

import http.client
import itertools
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import CheckContext, not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.core.transport import Response
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    negative_data_rejection,
    positive_data_acceptance,
    response_headers_conformance,
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
from tests.require import require_binary
from tests.services import REDIS_INSTALL, RedisServer

pytestmark = pytest.mark.e2e
#: Generated requests per operation and mode: ten operations take about a minute on two cores.
EXAMPLES = int(os.environ.get("FRAMEFLEET_FUZZ_EXAMPLES", "25"))
#: Rate limits a fuzz cannot reach (the settings' largest), and as many jobs in flight.
UNBOUNDED, IN_FLIGHT = "1000000", "100000"
#: What each check takes. A request the schema calls valid is taken (2xx), unless it names an
#: id that does not exist (404): no schema knows which do (each generated job gets an id of its
#: own). One it calls invalid is a 400, or the fault of its key (401), of an id (404) or of
#: its size (413).
STRICT = {"positive_data_acceptance": {"expected-statuses": ["2xx", "404"]},
          "negative_data_rejection": {"expected-statuses": ["400", "401", "404", "413"]}}
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


def fuzz(operation: Any, mode: GenerationMode) -> tuple[Counter[str], str | None]:
    """``EXAMPLES`` generated requests of one operation in one mode: (the statuses seen, a
    4xx with its code, and the first failure or None)."""
    statuses: Counter[str] = Counter()
    failures: list[str] = []
    excused: list[str] = []  # taken, though generated as invalid: Schemathesis judged them

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate])
    def run(case: Any) -> None:
        if mode is GenerationMode.POSITIVE and isinstance(case.body, dict) and "job_id" in \
                case.body:
            # an id of its own (Hypothesis draws "0" again and again): a 409 for an id taken
            # before would stand in for the answer to this request's own fields
            case.body["job_id"] = f"fuzz-{next(_IDS)}"
        try:
            response = case.call_and_validate(timeout=30, checks=CHECKS)
            statuses[_status(response)] += 1
            if mode is GenerationMode.NEGATIVE and response.status_code < 300:
                excused.append(case.as_curl_command())
        except (Exception, BaseExceptionGroup) as e:  # noqa: BLE001 - reported by the caller
            if not failures:  # the first of an operation's failures is enough to read
                failures.append(f"{' '.join(str(e).split())[:1500]}\n  {case.as_curl_command()}")

    run()
    # What Schemathesis's own rules let through: a query parameter the route does not read, a
    # form's number sent as the text it reads as.
    if excused:
        print(f"{operation.label}: {len(excused)} taken, generated as invalid; the first:\n  "
              f"{excused[0][:600]}")
    return statuses, (failures[0] if failures else None)


_IDS = itertools.count()


def _status(response: Any) -> str:
    """``200``, or ``429 too_many_in_flight``: a 4xx with its code."""
    if 400 <= response.status_code < 500 and response.content:
        return f"{response.status_code} {response.json()['error']['code']}"
    return str(response.status_code)


CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_headers_conformance, response_schema_conformance, positive_data_acceptance,
          negative_data_rejection, ignored_auth, error_shape]


def test_the_gateway_keeps_its_schema(api_fleet: ApiFleet, tmp_path: Path) -> None:  # noqa: F811
    # A replica of its own on a Redis of its own (no worker reads it: what it takes stays
    # queued), whose limits a fuzz does not reach: every request reaches the routes.
    # Schemathesis's own pytest loader (from_fixture) does not run under pytest 9: its
    # strategies are driven by Hypothesis here, per operation and mode.
    own = RedisServer(require_binary("redis-server", REDIS_INSTALL), tmp_path / "redis")
    own.start()
    try:
        with replica(api_fleet, tmp_path, "fuzzed", FRAMEFLEET_BROKER_URL=own.url,
                     FRAMEFLEET_RESULT_BACKEND=own.url,
                     FRAMEFLEET_API_ANON_RATE_PER_MINUTE=UNBOUNDED,
                     FRAMEFLEET_API_RATE_PER_MINUTE=UNBOUNDED,
                     FRAMEFLEET_API_MAX_IN_FLIGHT=IN_FLIGHT) as gateway:
            seen, failures = fuzz_all(gateway.url, api_fleet.keys["acme"].headers)
    finally:
        own.stop()
    print("\n".join(f"{label}: {dict(sorted(statuses.items()))}"
                    for label, statuses in seen.items()))
    print(f"{len(seen)} operations x modes, {EXAMPLES} examples each, "
          f"{len(failures)} failures")
    assert len(seen) >= 20  # every operation of the schema (fuzz_all counts them), both ways
    assert not failures, "\n".join(failures)
    # the POSTs took every request the schema calls valid (no cap reached: no 429)
    for label in ("POST /v1/videos [positive]", "POST /v1/jobs [positive]"):
        assert set(seen[label]) == {"200"}, seen[label]


def fuzz_all(url: str, headers: dict[str, str]) -> tuple[dict[str, Counter[str]], list[str]]:
    """Every operation of the key's own schema (its inputs' prefix is in it), both ways: the
    statuses of each, and the failures."""
    # The key as Schemathesis's own: every case carries it, the generated invalid ones are
    # invalid in their parameters and bodies, and ignored_auth sends each without it too.
    config = SchemathesisConfig.from_dict({"checks": STRICT, "headers": headers})
    schema = schemathesis.openapi.from_url(url + "/openapi.json", config=config,
                                           headers=headers)
    seen: dict[str, Counter[str]] = {}
    failures = []
    # The event stream first: a stream of a job the POSTs made lasts until the job ends,
    # and no worker runs them here.
    operations = sorted((result.ok() for result in schema.get_all_operations()),  # type: ignore[union-attr]
                        key=lambda op: not op.label.endswith("/events"))
    for operation in operations:
        # An operation that takes nothing (GET /v1/models) has nothing to make invalid: its
        # only wrong request, one without the key, is ignored_auth's
        # (Schemathesis lists the key as a header parameter of its own: not an input)
        takes = len(operation.body) > 0 or any(
            "x-original-security-type" not in p.definition for p in operation.iter_parameters())
        modes = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)[:2 if takes else 1]
        for mode in modes:
            label = f"{operation.label} [{mode.value}]"
            started = time.monotonic()
            seen[label], failure = fuzz(operation, mode)
            print(f"{label}: {time.monotonic() - started:.1f} s")
            if failure:
                failures.append(f"{label}: {failure}")
    assert len(seen) >= 2 * len(operations) - 1  # (GET /v1/models: positive only)
    return seen, failures


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
