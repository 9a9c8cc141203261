"""Webhooks through a real worker, Redis and S3, to receivers on loopback."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from producer.app import QUEUE
from producer.errors import InvalidJobError, JobFailed
from producer.wire.spec import JobResult, NotifySpec
from tests.e2e.helpers import pattern_spec, put_latents, verify_output
from tests.e2e.webhook_fleet import SECRET, TIMEOUT_S, Fleet, start_fleet
from tests.receiver import Receiver
from tests.services import free_port

pytestmark = pytest.mark.e2e

ALL_EVENTS = ("started", "segment", "succeeded", "failed", "cancelled")


@pytest.fixture
def fleet(redis_url: str, monkeypatch: pytest.MonkeyPatch, worker_factory: Any) -> Iterator[Fleet]:
    """``fleet(*ports, workers=1, **env)``: a client and workers sharing an allow-list."""
    yield from start_fleet(redis_url, monkeypatch, worker_factory)


def _job(s3: Any, bucket: str, job_id: str, urls: tuple[str, ...],
         events: tuple[str, ...] = ALL_EVENTS, latent_frames: int = 12) -> Any:
    uri = put_latents(s3, bucket, f"in/{job_id}.npy", latent_frames=latent_frames, fmt="npy")
    return pattern_spec(job_id, uri, bucket, segment_frames=12,
                        notify=NotifySpec(urls=urls, events=events))  # type: ignore[arg-type]


def test_signed_events_arrive_in_order(
    fleet: Fleet, s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    with Receiver() as rx:
        client = fleet(rx.port)
        result = client.submit(_job(s3, s3_bucket, "hook-ok", (rx.url(),))).wait(timeout=90)
        verify_output(s3, s3_bucket, result, tmp_path)
        # started, one event per segment in playlist order, then succeeded
        expected = 1 + len(result.manifest.segments) + 1
        got = rx.wait(expected, timeout=30)
        time.sleep(0.5)
        assert len(rx.received) == expected
    bodies = [r.json for r in got]
    assert [b["event"] for b in bodies] == ["started", *["segment"] * len(result.manifest.segments),
                                            "succeeded"]
    assert [b["sequence"] for b in bodies] == list(range(1, expected + 1))
    assert [b["data"]["segment"]["index"] for b in bodies[1:-1]] == list(
        range(len(result.manifest.segments)))
    for r in got:
        assert r.verifies(SECRET), r.headers
        assert not r.verifies("another fleet's secret")
        assert r.json["job_id"] == "hook-ok"
    # The succeeded body carries the very JobResult the client got, with the playlist
    assert JobResult.model_validate(bodies[-1]["data"]["result"]) == result
    playlist = result.manifest.playlist_uri
    assert playlist is not None and playlist.endswith("/index.m3u8")


def test_a_down_or_slow_receiver_neither_delays_nor_fails_the_job(
    fleet: Fleet, s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    down_port = free_port()
    down = f"http://127.0.0.1:{down_port}/hook"  # nothing listens there
    with Receiver(delay_s=60) as slow:
        client = fleet(slow.port, down_port)
        spec = _job(s3, s3_bucket, "hook-slow", (slow.url(), down), latent_frames=30)
        result = client.submit(spec).wait(timeout=90)
        verify_output(s3, s3_bucket, result, tmp_path)
        # Every attempt at the slow receiver lasts TIMEOUT_S: had the job waited for one,
        # its wall time would show it (it has 1 + 10 + 1 events for it)
        assert result.timings.wall_s < TIMEOUT_S, result.timings
        assert slow.wait(1, timeout=10)[0].json["event"] == "started"
        # and the worker goes on at once with the next job
        nxt = client.submit(pattern_spec(
            "after-slow", put_latents(s3, s3_bucket, "in/n.npy", 3, fmt="npy"), s3_bucket,
        )).wait(timeout=60)
        assert nxt.timings.wall_s < TIMEOUT_S


def test_a_failed_job_says_why(fleet: Fleet, s3: Any, s3_bucket: str) -> None:
    with Receiver() as rx:
        client = fleet(rx.port)
        spec = _job(s3, s3_bucket, "hook-fail", (rx.url(),), events=("failed", "succeeded"))
        spec = spec.model_copy(update={"input": spec.input.model_copy(
            update={"uri": f"s3://{s3_bucket}/in/missing.npy"})})
        with pytest.raises(JobFailed, match="InputNotFoundError"):
            client.submit(spec).wait(timeout=60)
        (got,) = rx.wait(1, timeout=30)
    assert got.verifies(SECRET)
    assert got.json["event"] == "failed"
    assert got.json["data"]["error"]["type"] == "InputNotFoundError"
    assert "missing.npy" in got.json["data"]["error"]["message"]


@pytest.mark.parametrize(("urls", "field", "why"), [
    (("http://127.0.0.1:9/hook", "http://169.254.169.254/latest/meta-data/"), "notify.urls[1]",
     "not in FRAMEFLEET_WEBHOOK_HOSTS"),
    (("https://10.0.0.5/hook",), "notify.urls[0]", "scheme 'https' not allowed"),
    (("http://hooks.example.com/",), "notify.urls[0]", "not in FRAMEFLEET_WEBHOOK_HOSTS"),
    (("http://127.0.0.1:9/elsewhere",), "notify.urls[0]", "path /elsewhere of 127.0.0.1:9"),
    (("http://127.0.0.1:10/hook",), "notify.urls[0]", "port 10 of 127.0.0.1 not allowed"),
])
def test_a_url_not_allowed_is_rejected_at_submit(
    fleet: Fleet, s3: Any, s3_bucket: str, urls: tuple[str, ...], field: str, why: str
) -> None:
    client = fleet(9, workers=0)
    spec = _job(s3, s3_bucket, "hook-refused", urls)
    with pytest.raises(InvalidJobError, match=rf"^{re.escape(field)}: .*{why}"):
        client.submit(spec)
    # Nothing was queued: the job_id is still free
    assert client.get("hook-refused").status() == "PENDING"
    assert redis.Redis.from_url(client.app.conf.broker_url).llen(QUEUE) == 0
