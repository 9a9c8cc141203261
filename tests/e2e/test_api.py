"""``framefleet api`` end to end: a real uvicorn process, a real Celery worker, Redis and
SeaweedFS, driven by the official ``openai`` SDK, unmodified, and by plain HTTP."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import av
import openai
import pytest
from openai import OpenAI

from tests.e2e.api_fleet import ApiFleet, api_fleet, wait_for  # noqa: F401 - the fixture

# The SDK marks its videos API deprecated (OpenAI's own service); the shape is what counts.
pytestmark = [pytest.mark.e2e,
              pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")]
STATE_ORDER = ["QUEUED", "STARTED", "PROGRESS", "SUCCESS"]


def sdk(fleet: ApiFleet, tenant: str) -> OpenAI:
    # max_retries 0: the SDK would otherwise retry a 429 by itself.
    return OpenAI(base_url=fleet.gateway.url + "/v1", api_key=fleet.keys[tenant].secret,
                  max_retries=0, timeout=30)


def http(fleet: ApiFleet, path: str, tenant: str | None = "acme", method: str = "GET",
         headers: dict[str, str] | None = None,
         body: bytes | None = None) -> tuple[int, Any, bytes]:
    """(status, headers: case-insensitive, body)."""
    h = {**(fleet.keys[tenant].headers if tenant else {}), **(headers or {})}
    req = urllib.request.Request(fleet.gateway.url + path, data=body, headers=h, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return int(r.status), r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


@pytest.fixture(scope="module")
def done(api_fleet: ApiFleet) -> Any:  # noqa: F811
    """One prompt job through the SDK's create_and_poll, to completion."""
    video = sdk(api_fleet, "acme").videos.create_and_poll(
        model="tiny", prompt="a red fox in the snow", seconds="1", size="48x32",
        poll_interval_ms=200)
    return video


def test_create_and_poll_reaches_completed(api_fleet: ApiFleet, done: Any) -> None:  # noqa: F811
    assert done.status == "completed", done.error
    assert (done.progress, done.model, done.size, done.seconds) == (100, "tiny", "48x32", "1")
    assert done.completed_at >= done.created_at
    ff = done.model_extra["framefleet"]
    assert ff["state"] == "SUCCESS" and ff["frames"] == 17 and ff["tier"] == "exact"
    assert ff["cost_usd"] > 0
    # The node name, as the CLI shows it (was the bare host name); a models tiny folder's
    # job says its weights are random
    assert ff["worker"] == api_fleet.worker.nodename and ff["random_weights"] is True


def test_download_content_decodes_every_frame(api_fleet: ApiFleet, done: Any,  # noqa: F811
                                              tmp_path: Path) -> None:
    data = sdk(api_fleet, "acme").videos.download_content(done.id).read()
    path = tmp_path / "v.mp4"
    path.write_bytes(data)
    with av.open(str(path)) as f:
        frames = [fr.to_ndarray(format="rgb24") for fr in f.decode(video=0)]
    assert len(frames) == 17 and frames[0].shape == (32, 48, 3)
    # Range: exactly the asked bytes, as S3 holds them.
    for asked, want in [("bytes=100-199", data[100:200]), ("bytes=-50", data[-50:]),
                        (f"bytes={len(data) - 7}-", data[-7:])]:
        status, headers, got = http(api_fleet, f"/v1/videos/{done.id}/content",
                                    headers={"Range": asked})
        assert status == 206 and got == want, asked
        assert headers["Content-Range"].endswith(f"/{len(data)}")
    status, headers, _ = http(api_fleet, f"/v1/videos/{done.id}/content",
                              headers={"Range": f"bytes={len(data) + 10}-"})
    assert status == 416 and headers["Content-Range"] == f"bytes */{len(data)}"


def test_list_pages_newest_first(api_fleet: ApiFleet, done: Any) -> None:  # noqa: F811
    client = sdk(api_fleet, "acme")
    made = [client.videos.create(model="tiny", prompt=f"clip {i}").id for i in range(3)]
    page = client.videos.list(limit=1)
    assert len(page.data) == 1 and page.has_more
    listed = [v.id for v in client.videos.list(limit=1)]  # every page, one by one
    assert [i for i in listed if i in made] == made[::-1]
    assert done.id in listed and listed.index(done.id) > listed.index(made[0])
    oldest_first = [v.id for v in client.videos.list(limit=2, order="asc")]
    assert [i for i in oldest_first if i in made] == made


def test_delete_cancels_a_running_job(api_fleet: ApiFleet) -> None:  # noqa: F811
    client = sdk(api_fleet, "acme")
    video = client.videos.create(model="tiny-slow", prompt="a slow one")
    wait_for(lambda: client.videos.retrieve(video.id).progress > 0 or None, 120,
             "denoise progress")
    gone = client.videos.delete(video.id)
    assert (gone.id, gone.deleted, gone.object) == (video.id, False, "video.deleted")
    ended = client.videos.poll(video.id, poll_interval_ms=200)
    assert ended.status == "failed" and ended.error is not None
    assert ended.error.code == "cancelled"
    assert ended.model_extra["framefleet"]["state"] == "REVOKED"


def events(fleet: ApiFleet, job: str) -> list[tuple[str, Any]]:
    """Read the whole event stream (it must end by itself)."""
    req = urllib.request.Request(fleet.gateway.url + f"/v1/jobs/{job}/events",
                                 headers=fleet.keys["acme"].headers)
    got, kind = [], None
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        for raw in r:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                kind = line.removeprefix("event: ")
            elif line.startswith("data: "):
                got.append((kind, json.loads(line.removeprefix("data: "))))
    return got


def test_sse_delivers_every_state_in_order_and_ends(api_fleet: ApiFleet) -> None:  # noqa: F811
    uri = api_fleet.put_latents("acme", "sse", latent_frames=12)  # 45 frames, 6 segments
    status, _, body = http(api_fleet, "/v1/jobs", method="POST",
                           headers={"Content-Type": "application/json"},
                           body=json.dumps(api_fleet.pattern_job("sse-1", uri)).encode())
    assert status == 200, body
    got = events(api_fleet, "sse-1")
    kinds = [k for k, _ in got]
    states = [d["state"] for k, d in got if k == "state"]
    assert kinds[-1] == "end" and got[-1][1]["state"] == "SUCCESS"
    # Every state, in order: queued (or already started), started, progress, success.
    assert {"STARTED", "PROGRESS", "SUCCESS"} <= set(states), states
    assert states == sorted(states, key=STATE_ORDER.index), states
    percents = [d["percent"] for k, d in got if k == "state"]
    assert percents == sorted(percents) and percents[-1] == 100
    segments = [d["index"] for k, d in got if k == "segment"]
    assert segments == list(range(6))
    # A segment event comes once its segment is listed: its URL serves it.
    status, _, seg = http(api_fleet, got[kinds.index("segment")][1]["url"])
    assert status == 200 and seg[4:8] == b"ftyp"


def test_security_through_the_real_process(api_fleet: ApiFleet, done: Any) -> None:  # noqa: F811
    evil = sdk(api_fleet, "evil")
    for call in (lambda: evil.videos.retrieve(done.id),
                 lambda: evil.videos.download_content(done.id),
                 lambda: evil.videos.delete(done.id)):
        with pytest.raises(openai.NotFoundError) as e:
            call()
        assert e.value.code == "not_found"
    assert done.id not in [v.id for v in evil.videos.list()]
    with pytest.raises(openai.BadRequestError) as bad:
        evil.videos.create(model="wan-14b", prompt="p")
    assert (bad.value.code, bad.value.param) == ("unknown_model", "model")
    with pytest.raises(openai.AuthenticationError):
        OpenAI(base_url=api_fleet.gateway.url + "/v1", api_key="wrong",
               max_retries=0).videos.list()
    assert http(api_fleet, "/v1/videos", tenant=None)[0] == 401
    for bad_id in ("%2e%2e", "..%2f..%2fetc", "a..b"):
        assert http(api_fleet, f"/v1/videos/{bad_id}")[0] == 404
    status, _, body = http(api_fleet, "/v1/jobs", method="POST", body=b"{" + b" " * 70_000,
                           headers={"Content-Type": "application/json"})
    assert status == 413 and json.loads(body)["error"]["code"] == "body_too_large"
    slow = sdk(api_fleet, "slow")  # 3 requests a minute
    for _ in range(3):
        slow.videos.list()
    with pytest.raises(openai.RateLimitError) as limited:
        slow.videos.list()
    assert 1 <= int(limited.value.response.headers["retry-after"]) <= 60
    # The owner still has it all.
    assert sdk(api_fleet, "acme").videos.retrieve(done.id).status == "completed"


def test_metrics_answer_loopback_without_a_key(api_fleet: ApiFleet) -> None:  # noqa: F811
    status, _, body = http(api_fleet, "/metrics", tenant=None)
    assert status == 200
    assert b'framefleet_api_requests_total{method="GET",route="/v1/videos/{video_id}"' in body
    assert http(api_fleet, "/readyz", tenant=None)[0] == 200
