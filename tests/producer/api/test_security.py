"""What a key may see and do: 401, another tenant's job as 404, ids that are paths, bounds
on bodies, rate and jobs in flight, the one error shape."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from openai._models import construct_type
from openai.types import Video, VideoDeleteResponse
from openai.types.video_create_error import VideoCreateError

from tests.gateway import Key
from tests.producer.api.conftest import create

KEYED = [("GET", "/v1/videos"), ("POST", "/v1/videos"), ("GET", "/v1/videos/video_x"),
         ("DELETE", "/v1/videos/video_x"), ("GET", "/v1/videos/video_x/content"),
         ("POST", "/v1/jobs"), ("GET", "/v1/jobs/x"), ("DELETE", "/v1/jobs/x"),
         ("GET", "/v1/jobs/x/events"), ("GET", "/v1/jobs/x/files/index.m3u8")]


def error_of(r: Any) -> dict[str, Any]:
    """The body of an error: OpenAI's shape, which the SDK's error model parses."""
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    VideoCreateError.model_validate(body["error"])
    return dict(body["error"])


@pytest.mark.parametrize(("method", "path"), KEYED)
def test_every_api_route_is_401_without_a_key(client: TestClient, method: str,
                                              path: str) -> None:
    r = client.request(method, path)
    assert r.status_code == 401 and error_of(r)["code"] == "missing_api_key"
    r = client.request(method, path, headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401 and error_of(r)["code"] == "invalid_api_key"


def test_open_routes_answer_without_a_key(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ready"}
    schema = client.get("/openapi.json").json()
    assert "/v1/videos" in schema["paths"] and "/v1/jobs/{job_id}/events" in schema["paths"]
    assert schema["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    page = client.get("/")
    assert page.status_code == 200 and "<video" in page.text
    # A browser asks for /favicon.ico on every page: an icon, not a 404 in every log.
    icon = client.get("/favicon.ico")
    assert icon.status_code == 200 and icon.headers["content-type"] == "image/svg+xml"
    assert icon.content.startswith(b"<svg") and '/static/favicon.svg"' in page.text
    assert client.get("/static/favicon.svg").content == icon.content
    # TestClient's peer is "testclient", not loopback: /metrics is not there for it.
    assert client.get("/metrics").status_code == 404


def test_another_tenants_job_is_404_like_an_unknown_one(
        client: TestClient, keys: dict[str, Key]) -> None:
    mine = create(client, keys["acme"])
    evil = keys["evil"].headers
    for method, path in [("GET", f"/v1/videos/{mine['id']}"),
                         ("DELETE", f"/v1/videos/{mine['id']}"),
                         ("GET", f"/v1/videos/{mine['id']}/content"),
                         ("GET", f"/v1/jobs/{mine['id']}"), ("DELETE", f"/v1/jobs/{mine['id']}"),
                         ("GET", f"/v1/jobs/{mine['id']}/events"),
                         ("GET", f"/v1/jobs/{mine['id']}/files/index.m3u8")]:
        theirs = client.request(method, path, headers=evil)
        unknown = client.request(method, path.replace(mine["id"], "video_unknown"),
                                 headers=evil)
        assert theirs.status_code == unknown.status_code == 404, (method, path)
        assert theirs.json() == unknown.json()
    assert client.get("/v1/videos", headers=evil).json()["data"] == []
    # Still there and still queued for its owner: evil's DELETE cancelled nothing.
    r = client.get(f"/v1/videos/{mine['id']}", headers=keys["acme"].headers)
    assert r.json()["framefleet"]["state"] == "QUEUED"


# ("." and ".." are normalised away by the HTTP client itself; "%2e%2e" reaches the route.)
@pytest.mark.parametrize("bad", ["%2e%2e", "a..b", "x" * 101, ".hidden", "a%2Fb", "a%00b",
                                 "%2e%2e%2f%2e%2e%2fetc"])
def test_a_path_like_id_is_404_without_a_lookup(
        client: TestClient, keys: dict[str, Key], bad: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    gw = client.app.state.gateway  # type: ignore[attr-defined]
    calls: list[Any] = []
    monkeypatch.setattr(gw.registry.r, "hget", lambda *a: calls.append(a))
    for path in (f"/v1/videos/{bad}", f"/v1/jobs/{bad}", f"/v1/videos/{bad}/content",
                 f"/v1/jobs/{bad}/files/index.m3u8"):
        r = client.get(path, headers=keys["acme"].headers)
        assert r.status_code == 404, (path, r.text)
        error_of(r)
    assert calls == []  # refused before Redis was asked


def test_only_the_files_a_job_writes_are_served(client: TestClient,
                                                keys: dict[str, Key]) -> None:
    video = create(client, keys["acme"])
    h = keys["acme"].headers
    for name in ("..%2F..%2Fkeys", "manifest.json.bak", "segment-1.mp4", "%2e%2e", "full.mp4x",
                 "previews/step-5.mp4", "previews/latest.mp4x", "previews/x/latest.mp4",
                 "previews/..%2Fmanifest.json", "previews/",
                 "other/latest.mp4", "previews/step-000005.mp4"):
        r = client.get(f"/v1/jobs/{video['id']}/files/{name}", headers=h)
        assert r.status_code == 404 and error_of(r)["message"] in ("no such file",
                                                                   "no such route"), name


def test_unknown_model_and_bad_fields_are_400_naming_the_field(
        client: TestClient, keys: dict[str, Key]) -> None:
    h = keys["acme"].headers
    for body, param in [({"model": "nope"}, "model"), ({"model": "/models/tiny"}, "model"),
                        ({"size": "47x32"}, "size"), ({"seconds": "0.3"}, "seconds"),
                        ({"prompt": ""}, "prompt"), ({"extra": 1}, "extra")]:
        r = client.post("/v1/videos", json={"prompt": "p", "model": "tiny", **body}, headers=h)
        assert r.status_code == 400, r.text
        assert error_of(r)["param"] == param, r.json()


def test_bodies_over_the_limit_are_413(client: TestClient, keys: dict[str, Key]) -> None:
    h = keys["acme"].headers
    r = client.post("/v1/videos", json={"prompt": "x" * 5000}, headers=h)
    assert r.status_code == 413 and error_of(r)["code"] == "body_too_large"
    r = client.post("/v1/jobs", json={"job_id": "j", "x": "y" * 5000}, headers=h)
    assert r.status_code == 413 and error_of(r)["code"] == "body_too_large"

    def chunks() -> Any:  # no Content-Length: the limit counts what arrives
        for _ in range(10):
            yield b" " * 1000

    r = client.post("/v1/jobs", content=chunks(),
                    headers={**h, "content-type": "application/json"})
    assert r.status_code == 413 and error_of(r)["code"] == "body_too_large"
    big = b"\x89PNG\r\n\x1a\n" + b"0" * 20_000
    r = client.post("/v1/videos", data={"prompt": "p", "model": "tiny-i2v"},
                    files={"input_reference": ("a.png", big, "image/png")}, headers=h)
    assert r.status_code == 413 and error_of(r)["code"] == "body_too_large"


def test_over_the_rate_limit_is_429_with_retry_after(
        client: TestClient, keys: dict[str, Key]) -> None:
    h = keys["slow"].headers  # 3 requests per minute
    assert [client.get("/v1/videos", headers=h).status_code for _ in range(3)] == [200] * 3
    r = client.get("/v1/videos", headers=h)
    assert r.status_code == 429 and error_of(r)["code"] == "rate_limit_exceeded"
    assert 1 <= int(r.headers["retry-after"]) <= 60
    # Per tenant: another key is not held back.
    assert client.get("/v1/videos", headers=keys["acme"].headers).status_code == 200


def test_jobs_in_flight_are_bounded_per_tenant(client: TestClient,
                                               keys: dict[str, Key]) -> None:
    create(client, keys["one"])  # queued: no worker runs it
    r = client.post("/v1/videos", json={"prompt": "p"}, headers=keys["one"].headers)
    assert r.status_code == 429 and error_of(r)["code"] == "too_many_in_flight"
    assert int(r.headers["retry-after"]) >= 1
    assert len(client.get("/v1/videos", headers=keys["one"].headers).json()["data"]) == 1


def sdk_video(obj: dict[str, Any]) -> Video:
    """Parse as the SDK does (its default, non-strict response parsing), and check every
    field strictly too, but ``size``: the SDK's type lists only Sora's four sizes, and a
    framefleet size is its model's (48x32 here)."""
    Video.model_validate({**obj, "size": "1280x720"})
    video = construct_type(type_=Video, value=obj)
    assert isinstance(video, Video)
    return video


def test_every_video_response_parses_with_the_sdk_model(
        client: TestClient, keys: dict[str, Key]) -> None:
    video = create(client, keys["acme"])
    got = sdk_video(video)
    assert (got.status, got.progress, got.model, got.size) == ("queued", 0, "tiny", "48x32")
    assert got.framefleet["job_id"] != video["id"]  # type: ignore[attr-defined]
    listed = client.get("/v1/videos", headers=keys["acme"].headers).json()
    assert [sdk_video(v).id for v in listed["data"]] == [video["id"]]
    r = client.delete(f"/v1/videos/{video['id']}", headers=keys["acme"].headers)
    assert r.json() == {"id": video["id"], "object": "video.deleted", "deleted": False}
    VideoDeleteResponse.model_validate(r.json())
