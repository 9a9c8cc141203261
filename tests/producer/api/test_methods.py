"""Every method of a path: HEAD wherever GET answers (same status and headers, no body), a
405's ``Allow`` lists all the path's methods, and a Prometheus scrape from loopback is never
starved by other keyless clients of its address."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from producer.api.app import create_app
from producer.settings import Settings
from tests.gateway import Key
from tests.producer.api.conftest import create


@pytest.fixture
def loopback(api_settings: Settings) -> Iterator[TestClient]:
    """The app as a peer on 127.0.0.1 sees it (``/metrics`` answers it)."""
    with TestClient(create_app(api_settings), client=("127.0.0.1", 50000)) as c:
        yield c


def test_head_answers_wherever_get_does(loopback: TestClient, keys: dict[str, Key]) -> None:
    acme = keys["acme"].headers
    video = create(loopback, keys["acme"])
    job = loopback.get(f"/v1/videos/{video['id']}", headers=acme).json()
    native = loopback.post("/v1/jobs", headers=acme, json={
        "job_id": "head-1", "generate": {"model": "tiny", "prompt": "x", "width": 48,
                                         "height": 32, "num_frames": 9,
                                         "num_inference_steps": 2}})
    assert native.status_code == 200, native.text
    for path, headers in [("/", {}), ("/healthz", {}), ("/readyz", {}), ("/metrics", {}),
                          ("/openapi.json", {}), ("/v1/videos", acme),
                          (f"/v1/videos/{video['id']}", acme), ("/v1/jobs/head-1", acme)]:
        get = loopback.get(path, headers=headers)
        head = loopback.head(path, headers=headers)
        assert (get.status_code, head.status_code) == (200, 200), (path, head.text)
        assert head.content == b"", path
        assert head.headers["content-type"] == get.headers["content-type"], path
        if path not in ("/metrics", "/v1/videos", f"/v1/videos/{video['id']}"):
            # what changes between two calls (counters, progress) may change the length
            assert head.headers["content-length"] == get.headers["content-length"], path
    assert job["id"]
    # A HEAD is answered like its GET, errors too: no key, unknown id
    assert loopback.head("/v1/videos").status_code == 401
    assert loopback.head("/v1/jobs/nope", headers=acme).status_code == 404


def test_a_stream_has_no_head(loopback: TestClient, keys: dict[str, Key]) -> None:
    # An event stream's GET does not end while the job runs: HEAD is a 405 that says GET.
    r = loopback.head("/v1/jobs/any/events", headers=keys["acme"].headers)
    assert (r.status_code, r.headers.get("allow")) == (405, "GET"), (r.status_code, r.headers)


@pytest.mark.parametrize(("method", "path", "allow"), [
    ("PUT", "/v1/videos", "GET, HEAD, POST"),
    ("PATCH", "/v1/videos/video_x", "DELETE, GET, HEAD"),
    ("POST", "/v1/videos/video_x/content", "GET, HEAD"),
    ("PUT", "/v1/jobs", "POST"),
    ("PATCH", "/v1/jobs/j", "DELETE, GET, HEAD"),
    ("DELETE", "/v1/jobs/j/files/index.m3u8", "GET, HEAD"),
    ("POST", "/healthz", "GET, HEAD"),
    ("DELETE", "/", "GET, HEAD"),
])
def test_405_allow_lists_every_method_of_the_path(loopback: TestClient, keys: dict[str, Key],
                                                  method: str, path: str, allow: str) -> None:
    r = loopback.request(method, path, headers=keys["acme"].headers)
    assert r.status_code == 405, r.text
    assert r.headers["allow"] == allow
    error = r.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "method_not_allowed")
    assert allow in error["message"]


def test_a_loopback_scrape_is_not_starved_by_keyless_callers(api_settings: Settings) -> None:
    settings = api_settings.model_copy(update={"api_anon_rate_per_minute": 5})
    with TestClient(create_app(settings), client=("127.0.0.1", 50000)) as c:
        for _ in range(5):
            assert c.get("/v1/videos").status_code == 401
        assert c.get("/v1/videos").status_code == 429  # the address's budget is spent
        for _ in range(10):
            assert c.get("/metrics").status_code == 200  # its own: exempt from loopback
    # From elsewhere /metrics does not exist, and asking still costs the address's budget.
    with TestClient(create_app(settings), client=("192.0.2.7", 50000)) as c:
        statuses = [c.get("/metrics").status_code for _ in range(7)]
        assert statuses[:5] == [404] * 5 and statuses[5:] == [429, 429]
