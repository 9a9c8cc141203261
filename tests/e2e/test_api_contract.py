"""What the gateway promises its clients, through real processes (``framefleet api`` under
uvicorn, a Celery worker, Redis, SeaweedFS):

- a Range past the object's end is clamped (206), as RFC 9110 says; HEAD answers the content
  routes' status and headers without a body; a 405 is the client's error;
- a worker's raw exception never reaches a client: a stable code and a short message, while the
  worker's log keeps the detail;
- ``progress`` never goes back, not even to 0 after a cancel;
- one tenant's open event streams are capped across replicas (429 with Retry-After), and a
  closed stream gives its slot back.
"""

from __future__ import annotations

import http.client
import json
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from producer.api.failures import UNEXPECTED
from producer.state import keys
from tests.e2e.api_fleet import (  # noqa: F401 - api_fleet is the fixture
    ApiFleet,
    api_fleet,
    call,
    post_json,
    replica,
    wait_for,
)
from tests.e2e.paced_worker import FAULT_VALUE

pytestmark = pytest.mark.e2e
RAW = "shape '[1, 45, 1, -1]' is invalid"


def get(fleet: ApiFleet, path: str) -> Any:
    status, _, body = call(fleet.gateway.url, path, fleet.keys["acme"])
    assert status == 200, body
    return json.loads(body)


def ended(fleet: ApiFleet, job_id: str, timeout: float = 120) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        job: dict[str, Any] = get(fleet, f"/v1/jobs/{job_id}")
        return job if job["state"] in ("SUCCESS", "FAILURE", "REVOKED") else None
    return wait_for(probe, timeout, f"the end of {job_id}")  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def video(api_fleet: ApiFleet) -> tuple[str, bytes]:  # noqa: F811
    """A completed /v1/videos job and its full.mp4."""
    status, body = post_json(api_fleet.gateway.url, "/v1/videos", api_fleet.keys["acme"],
                             {"model": "tiny", "prompt": "a fox", "seconds": "1"})
    assert status == 200, body
    wait_for(lambda: get(api_fleet, f"/v1/videos/{body['id']}")["status"] == "completed"
             or None, 120, "the video")
    status, _, data = call(api_fleet.gateway.url, f"/v1/videos/{body['id']}/content",
                           api_fleet.keys["acme"])
    assert status == 200 and len(data) > 100
    return body["id"], data


def test_a_range_past_the_end_is_clamped(api_fleet: ApiFleet,  # noqa: F811
                                         video: tuple[str, bytes]) -> None:
    vid, data = video
    n = len(data)
    for asked, first in [("bytes=0-9999999999999999999", 0),
                         ("bytes=5-99999999999999999999999999999999", 5),
                         (f"bytes=10-{n}", 10), ("bytes=-99999999999999999999", 0)]:
        status, headers, got = call(api_fleet.gateway.url, f"/v1/videos/{vid}/content",
                                    api_fleet.keys["acme"], headers={"Range": asked})
        assert status == 206, (asked, got[:200])
        assert headers["Content-Range"] == f"bytes {first}-{n - 1}/{n}", asked
        assert got == data[first:] and headers["Content-Length"] == str(n - first)
    status, headers, _ = call(api_fleet.gateway.url, f"/v1/videos/{vid}/content",
                              api_fleet.keys["acme"], headers={"Range": f"bytes={n}-"})
    assert status == 416 and headers["Content-Range"] == f"bytes */{n}"
    # Not a single usable range: ignored, the whole file (RFC 9110 allows it).
    for ignored in ("bytes=9-3", "bytes=0-1,5-9", "items=0-9"):
        status, _, got = call(api_fleet.gateway.url, f"/v1/videos/{vid}/content",
                              api_fleet.keys["acme"], headers={"Range": ignored})
        assert (status, got) == (200, data), ignored


def test_head_answers_the_content_routes_and_405_is_the_clients(
        api_fleet: ApiFleet, video: tuple[str, bytes]) -> None:  # noqa: F811
    vid, data = video
    job_id = get(api_fleet, f"/v1/videos/{vid}")["id"]
    conn = http.client.HTTPConnection("127.0.0.1", api_fleet.gateway.port, timeout=30)
    auth = api_fleet.keys["acme"].headers
    try:
        for path, extra, status, length in [
                (f"/v1/videos/{vid}/content", {}, 200, len(data)),
                (f"/v1/videos/{vid}/content", {"Range": "bytes=0-99"}, 206, 100),
                (f"/v1/jobs/{job_id}/files/full.mp4", {}, 200, len(data)),
                (f"/v1/jobs/{job_id}/files/manifest.json", {}, 200, None)]:
            conn.request("HEAD", path, headers={**auth, **extra})
            r = conn.getresponse()
            assert r.status == status, (path, r.read())
            assert r.read() == b""  # no body, and the connection carries on
            if length is not None:
                assert r.getheader("Content-Length") == str(length)
            assert r.getheader("Accept-Ranges") == "bytes"
        conn.request("HEAD", f"/v1/videos/{vid}/content", headers={**auth, "Range": "bytes=0-"})
        r = conn.getresponse()
        r.read()
        assert r.getheader("Content-Range") == f"bytes 0-{len(data) - 1}/{len(data)}"
        conn.request("HEAD", "/v1/videos/nope/content", headers=auth)
        r = conn.getresponse()
        assert (r.status, r.read()) == (404, b"")
    finally:
        conn.close()
    status, headers, body = call(api_fleet.gateway.url, f"/v1/videos/{vid}/content",
                                 api_fleet.keys["acme"], method="PUT")
    error = json.loads(body)["error"]
    assert (status, error["type"], error["code"]) == (405, "invalid_request_error",
                                                      "method_not_allowed")
    assert "GET" in headers["Allow"]


def test_a_raw_worker_exception_reads_as_a_code(api_fleet: ApiFleet) -> None:  # noqa: F811
    uri = api_fleet.put_latents("acme", "raw", latent_frames=2, fill=FAULT_VALUE)
    status, body = post_json(api_fleet.gateway.url, "/v1/jobs", api_fleet.keys["acme"],
                             api_fleet.pattern_job("raw", uri))
    assert status == 200, body
    job = ended(api_fleet, "raw")
    assert job["state"] == "FAILURE"
    assert job["reason"] == UNEXPECTED.message and job["detail"] == f"failed: {UNEXPECTED.message}"
    video = get(api_fleet, "/v1/videos/raw")
    assert video["error"] == {"code": "internal_error", "message": UNEXPECTED.message}
    for text in (json.dumps(job), json.dumps(video), call(api_fleet.gateway.url,
                                                          "/v1/videos?limit=50",
                                                          api_fleet.keys["acme"])[2].decode()):
        assert "RuntimeError" not in text and "45, 1" not in text
    # The detail is where the operator looks: the worker's log, under the job's key.
    log = api_fleet.worker.log_text()
    assert RAW in log and job["job_id"] in log
    # A spec error is written for its sender: it passes, naming the input.
    uri = api_fleet.put_latents("acme", "nan", latent_frames=2, fill=float("nan"))
    assert post_json(api_fleet.gateway.url, "/v1/jobs", api_fleet.keys["acme"],
                     api_fleet.pattern_job("nan", uri))[0] == 200
    error = get(api_fleet, f"/v1/videos/{ended(api_fleet, 'nan')['id']}")["error"]
    assert error["code"] == "invalid_job" and "NaN" in error["message"], error


def test_progress_never_goes_back_after_a_cancel(api_fleet: ApiFleet) -> None:  # noqa: F811
    uri = api_fleet.put_latents("acme", "undo", latent_frames=40)  # 157 frames, ~6 s
    assert post_json(api_fleet.gateway.url, "/v1/jobs", api_fleet.keys["acme"],
                     api_fleet.pattern_job("undo", uri))[0] == 200
    seen: list[int] = []

    def far_enough() -> bool | None:
        seen.append(get(api_fleet, "/v1/jobs/undo")["percent"])
        return seen[-1] >= 20 or None

    wait_for(far_enough, 120, "20 % progress")
    assert call(api_fleet.gateway.url, "/v1/jobs/undo", api_fleet.keys["acme"],
                "DELETE")[0] == 200
    job = ended(api_fleet, "undo")
    assert job["state"] == "REVOKED", job
    video = get(api_fleet, "/v1/videos/undo")
    assert video["error"]["code"] == "cancelled"
    assert seen == sorted(seen)
    assert job["percent"] >= max(seen) and video["progress"] >= max(seen), (seen, job)
    # Sent again, the job runs anew: its new run counts, and finishes, on its own.
    assert post_json(api_fleet.gateway.url, "/v1/jobs", api_fleet.keys["acme"],
                     api_fleet.pattern_job("undo", uri))[0] == 200
    again = ended(api_fleet, "undo")
    assert (again["state"], again["percent"]) == ("SUCCESS", 100), again
    assert again["completed_at"] > job["completed_at"]


def open_stream(port: int, job_id: str, key: Any) -> tuple[http.client.HTTPConnection,
                                                            http.client.HTTPResponse]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", f"/v1/jobs/{job_id}/events", headers=key.headers)
    return conn, conn.getresponse()


def test_event_streams_are_capped_per_tenant_across_replicas(
        api_fleet: ApiFleet, tmp_path: Path, redis_url: str) -> None:  # noqa: F811
    acme, r = api_fleet.keys["acme"], redis.Redis.from_url(redis_url)
    env = {"FRAMEFLEET_API_MAX_STREAMS": "2"}
    with replica(api_fleet, tmp_path, "sse-a", **env) as a, \
            replica(api_fleet, tmp_path, "sse-b", **env) as b:
        # Sent once both replicas are up: its streams stay open while the test needs them.
        uri = api_fleet.put_latents("acme", "watched", latent_frames=100)  # ~15 s
        assert post_json(a.url, "/v1/jobs", acme, api_fleet.pattern_job("watched", uri))[0] == 200
        held = [open_stream(a.port, "watched", acme), open_stream(b.port, "watched", acme)]
        for _, resp in held:
            assert resp.status == 200 and resp.readline().startswith(b"event: ")
        conn, refused = open_stream(a.port, "watched", acme)
        assert refused.status == 429, refused.status
        body = json.loads(refused.read())
        conn.close()
        assert refused.status == 429 and int(refused.getheader("Retry-After") or 0) >= 1
        assert body["error"]["code"] == "too_many_streams"
        # The client that goes away gives its slot back, and the next stream opens.
        held[0][0].close()
        wait_for(lambda: r.zcard(keys.api_streams("acme")) < 2 or None, 10, "a freed slot")
        held[0] = open_stream(a.port, "watched", acme)
        assert held[0][1].status == 200
        for conn, _ in held:
            conn.close()
        wait_for(lambda: r.zcard(keys.api_streams("acme")) == 0 or None, 10, "every slot back")
        # A stream read to its end still works, and ends with the job.
        conn, resp = open_stream(a.port, "watched", acme)
        events = [line for line in resp.read().decode().splitlines()
                  if line.startswith("event: ")]
        conn.close()
        assert events[-1] == "event: end"
    assert r.zcard(keys.api_streams("acme")) == 0


def test_the_gateway_and_the_worker_stay_healthy(api_fleet: ApiFleet) -> None:  # noqa: F811
    assert call(api_fleet.gateway.url, "/readyz")[0] == 200
    status, body = post_json(api_fleet.gateway.url, "/v1/videos", api_fleet.keys["acme"],
                             {"model": "tiny", "prompt": "after it all"})
    assert status == 200, body
    started = time.monotonic()
    wait_for(lambda: get(api_fleet, f"/v1/videos/{body['id']}")["status"] == "completed"
             or None, 120, "a last video")
    assert time.monotonic() - started < 120 and api_fleet.worker.running
