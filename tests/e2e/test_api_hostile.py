"""The gateway under hostile or careless clients, through real processes: ``framefleet api``
under uvicorn, a Celery worker, Redis and SeaweedFS. Each test sends the attack, then shows
that the gateway refuses it cleanly and that it and the worker still serve a real job.

- the native ``/v1/jobs`` keeps the model map's limits, as ``/v1/videos`` does;
- a refused ``/v1/jobs`` leaves no record anywhere;
- JSON nested 2,000 deep is a 400 naming the body, and the connection stays usable;
- random HTTP methods sent without a key do not grow ``/metrics`` or the gateway's memory;
- requests without a valid key are rate-limited per client address, across replicas.
"""

from __future__ import annotations

import http.client
import json
import re
import secrets
from pathlib import Path
from typing import Any

import pytest
import redis

from producer.api.registry import fleet_id
from producer.state import keys
from tests.e2e.api_fleet import (  # noqa: F401 - api_fleet is the fixture
    ApiFleet,
    api_fleet,
    call,
    post_json,
    replica,
    wait_for,
)

pytestmark = pytest.mark.e2e
GEN = {"model": "tiny", "prompt": "a fox", "width": 48, "height": 32, "num_frames": 5,
       "num_inference_steps": 2, "dtype": "float32"}


def job(fleet: ApiFleet, job_id: str) -> tuple[int, Any]:
    status, _, body = call(fleet.gateway.url, f"/v1/jobs/{job_id}", fleet.keys["acme"])

    return status, json.loads(body)


def finishes(fleet: ApiFleet, job_id: str, timeout: float = 120) -> dict[str, Any]:
    """The job object once the job has ended."""

    def probe() -> dict[str, Any] | None:
        found: dict[str, Any] = job(fleet, job_id)[1]
        return found if found.get("state") in ("SUCCESS", "FAILURE", "REVOKED") else None

    ended: dict[str, Any] = wait_for(probe, timeout, f"the end of {job_id}")
    return ended


def no_trace(fleet: ApiFleet, redis_url: str, public: str) -> None:
    """Nothing of the public id ``public`` anywhere: API, listing, Redis, the fleet."""
    acme = fleet.keys["acme"]
    assert job(fleet, public)[0] == 404
    assert call(fleet.gateway.url, f"/v1/videos/{public}", acme)[0] == 404
    assert call(fleet.gateway.url, f"/v1/jobs/{public}", acme, "DELETE")[0] == 404
    _, _, listed = call(fleet.gateway.url, "/v1/videos?limit=100", acme)
    assert f'"id":"{public}"' not in listed.decode().replace(" ", "")
    r = redis.Redis.from_url(redis_url)
    fid = fleet_id("acme", public)
    assert not r.exists(keys.api_job(fid))
    assert r.zscore(keys.api_in_flight("acme"), fid) is None
    assert r.zscore(keys.api_listing("acme"), public) is None
    assert not r.exists(keys.claim(f"acme:{fid}")), "the fleet was sent the job"


def test_native_jobs_keep_the_model_maps_limits(api_fleet: ApiFleet,  # noqa: F811
                                                redis_url: str) -> None:
    url, acme = api_fleet.gateway.url, api_fleet.keys["acme"]
    # "tiny": max_steps 50, max_seconds 10 at 16 fps (161 frames), max_pixels 921600.
    for change, param in [({"num_inference_steps": 900}, "generate.num_inference_steps"),
                          ({"num_frames": 1001}, "generate.num_frames"),
                          ({"width": 4096, "height": 4096}, "generate.width")]:
        public = f"limit-{secrets.token_hex(3)}"
        status, body = post_json(url, "/v1/jobs", acme,
                                 {"job_id": public, "generate": {**GEN, **change}})
        assert status == 400, body
        assert body["error"]["param"] == param, body
        assert body["error"]["code"] == "invalid_value"
        no_trace(api_fleet, redis_url, public)
    # /v1/videos refuses the same steps by the same check, naming its own field.
    status, body = post_json(url, "/v1/videos", acme,
                             {"model": "tiny", "prompt": "p", "steps": 900})
    assert (status, body["error"]["param"]) == (400, "steps")
    assert body["error"]["message"].endswith("900 is not in [1, 50]")
    # Within the limits, the same native job runs.
    status, body = post_json(url, "/v1/jobs", acme, {"job_id": "limit-ok", "generate": GEN})
    assert status == 200, body
    assert finishes(api_fleet, "limit-ok")["state"] == "SUCCESS"


@pytest.mark.parametrize(("change", "param"), [
    ({"notify": {"urls": ["https://127.0.0.1/hook"]}}, "notify.urls[0]"),
    ({"time_limit_s": 80_000}, "time_limit_s"),  # a valid spec; over the fleet's 6 h
    ({"decoder": {"name": "wan2.1-vae"}}, "decoder.weights"),  # a Wan decoder needs weights
])
def test_a_refused_native_job_leaves_no_record(api_fleet: ApiFleet, redis_url: str,  # noqa: F811
                                               change: dict[str, Any], param: str) -> None:
    public = f"refused-{secrets.token_hex(3)}"
    uri = api_fleet.put_latents("acme", public, latent_frames=2)
    status, body = post_json(api_fleet.gateway.url, "/v1/jobs", api_fleet.keys["acme"],
                             {**api_fleet.pattern_job(public, uri), **change})
    assert status == 400, body
    assert body["error"]["param"] == param, body
    no_trace(api_fleet, redis_url, public)
    # Sent again without the fault, the same id is a fresh job that runs.
    status, body = post_json(api_fleet.gateway.url, "/v1/jobs", api_fleet.keys["acme"],
                             api_fleet.pattern_job(public, uri))
    assert status == 200, body
    assert finishes(api_fleet, public)["state"] == "SUCCESS"


def test_a_conflicting_resubmit_keeps_the_first_record(api_fleet: ApiFleet) -> None:  # noqa: F811
    uri = api_fleet.put_latents("acme", "first", latent_frames=2)
    first = api_fleet.pattern_job("first", uri)
    assert post_json(api_fleet.gateway.url, "/v1/jobs", api_fleet.keys["acme"], first)[0] == 200
    status, body = post_json(api_fleet.gateway.url, "/v1/jobs", api_fleet.keys["acme"],
                             {**first, "priority": 9})
    assert (status, body["error"]["code"]) == (409, "conflict")
    # The 409 took nothing of the job it collided with.
    assert finishes(api_fleet, "first")["state"] == "SUCCESS"


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/videos"])
def test_deeply_nested_json_is_a_400_and_the_connection_stays(api_fleet: ApiFleet,  # noqa: F811
                                                              path: str) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", api_fleet.gateway.port, timeout=30)
    headers = {**api_fleet.keys["acme"].headers, "Content-Type": "application/json"}
    try:
        for body in (b"[" * 2000, b"[" * 100 + b"]" * 100, b'{"a":' * 40 + b"1" + b"}" * 40):
            conn.request("POST", path, body=body, headers=headers)
            r = conn.getresponse()
            answer = r.read()
            assert r.status == 400, answer
            assert r.getheader("Content-Type") == "application/json"

            error = json.loads(answer)["error"]
            assert (error["code"], error["param"]) == ("invalid_json", "body"), error
            assert error["message"].startswith("body: nested deeper than 32 levels")
        # The same connection answers the next request.
        conn.request("GET", "/v1/videos?limit=1", headers=api_fleet.keys["acme"].headers)
        r = conn.getresponse()
        r.read()
        assert r.status == 200
    finally:
        conn.close()
    assert call(api_fleet.gateway.url, "/readyz")[0] == 200


def rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    assert found is not None
    return int(found.group(1))


def random_methods(port: int, count: int) -> set[int]:
    """``count`` requests with random 4 KB method names, no key; the statuses seen."""
    seen = set()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        for i in range(count):
            method = "".join(secrets.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(4096))
            conn.request(method, "/v1/videos" if i % 2 else "/")
            r = conn.getresponse()
            r.read()
            seen.add(r.status)
            if r.will_close:
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    finally:
        conn.close()
    return seen


def test_random_methods_without_a_key_leave_metrics_and_memory_bounded(
        api_fleet: ApiFleet, tmp_path: Path) -> None:  # noqa: F811
    # A limit this high lets every request reach the router: the labels are what is tested.
    with replica(api_fleet, tmp_path, "metrics-gw",
                 FRAMEFLEET_API_ANON_RATE_PER_MINUTE="1000000") as gw:
        random_methods(gw.port, 200)  # warm: the allocator's arenas, the label set
        call(gw.url, "/metrics")  # and /metrics' own series
        before = len(call(gw.url, "/metrics")[2]), rss_kib(gw.pid)
        statuses = random_methods(gw.port, 2000)
        metrics = call(gw.url, "/metrics")[2]
        after = len(metrics), rss_kib(gw.pid)
        assert statuses <= {400, 404, 405}, statuses
        assert after[0] - before[0] < 2048, (before, after)  # was +16 MB
        assert after[1] - before[1] < 8 * 1024, (before, after)  # KiB
        assert b'method="other"' in metrics
        assert not re.search(rb'method="[A-Z]{5,}"', metrics.replace(b'"DELETE"', b"")
                             .replace(b'"OPTIONS"', b""))
        print(f"\n/metrics {before[0]} -> {after[0]} bytes, RSS {before[1]} -> {after[1]} KiB "
              "after 2000 random 4 KB methods")
        assert call(gw.url, "/readyz")[0] == 200


def test_requests_without_a_key_are_limited_per_address_across_replicas(
        api_fleet: ApiFleet, tmp_path: Path) -> None:  # noqa: F811
    env = {"FRAMEFLEET_API_ANON_RATE_PER_MINUTE": "20",
           "FRAMEFLEET_API_TRUSTED_PROXIES": "127.0.0.1"}
    with replica(api_fleet, tmp_path, "anon-a", **env) as a, \
            replica(api_fleet, tmp_path, "anon-b", **env) as b:
        # Two clients behind the trusted proxy (loopback), told apart by X-Forwarded-For.
        mallory = {"X-Forwarded-For": "203.0.113.7"}
        statuses = [call(gw.url, "/v1/videos", headers=mallory)[0]
                    for gw in (a, b) * 10]  # 20 across both replicas: all spent
        assert statuses == [401] * 20
        for path, headers in [("/v1/videos", mallory), ("/", mallory),
                              ("/nowhere", mallory),
                              ("/v1/videos", {**mallory, "Authorization": "Bearer wrong"})]:
            status, got, body = call(b.url, path, headers=headers)
            assert status == 429, (path, body)
            assert 1 <= int(got["Retry-After"]) <= 60

            assert json.loads(body)["error"]["type"] == "rate_limit_error"
        # Probes stay exempt; another address and a valid key are not limited.
        assert call(a.url, "/healthz", headers=mallory)[0] == 200
        assert call(b.url, "/readyz", headers=mallory)[0] == 200
        assert call(a.url, "/v1/videos", headers={"X-Forwarded-For": "203.0.113.8"})[0] == 401
        assert call(a.url, "/v1/videos", api_fleet.keys["acme"], headers=mallory)[0] == 200
        # The replicas' own peers (no proxy header) are counted as themselves.
        assert call(a.url, "/v1/videos")[0] == 401
