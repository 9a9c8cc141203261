"""Previews through real Redis, a Celery worker and SeaweedFS, with webhook receivers on
loopback: in step order, each decoding at the size and frame count announced; webhooks only
for receivers that ask; the worker's default and ``every: 0``; ``latest.mp4`` read while it is
replaced; a cancel; and an S3 outage during the previews that the job rides out."""

from __future__ import annotations

import io
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import pytest

from producer.client import JobHandle
from producer.wire.spec import JobSpec, NotifySpec, OutputSpec, VideoSpec
from tests.e2e.webhook_fleet import Fleet, start_fleet
from tests.receiver import Receiver
from tests.services import S3Server, free_port
from tests.worker.generate.tiny import save_tiny_model, tiny_generate

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("models") / "tiny-wan")


@pytest.fixture
def fleet(redis_url: str, monkeypatch: pytest.MonkeyPatch, worker_factory: Any) -> Iterator[Fleet]:
    yield from start_fleet(redis_url, monkeypatch, worker_factory)


def _env(model: Path, **extra: str) -> dict[str, str]:
    # The tiny model's steps take milliseconds (100 in 0.6 s on a CI machine): paced, the
    # denoise lasts long enough for the status polls and the previews' writer to see each step
    return {"FRAMEFLEET_TEST_APP": "tests.e2e.paced_worker", "FRAMEFLEET_TEST_STEP_S": "0.02",
            "FRAMEFLEET_DEVICE": "cpu", "OMP_NUM_THREADS": "1",
            "FRAMEFLEET_FILE_ROOTS": str(model.parent), "FRAMEFLEET_WARMUP_MODEL": str(model),
            "FRAMEFLEET_MAX_DENOISE_STEPS": "2000", **extra}


def _spec(job_id: str, bucket: str, model: Path, notify: NotifySpec | None = None,
          **gen: Any) -> JobSpec:
    return JobSpec(job_id=job_id, tenant="e2e", generate=tiny_generate(model, **gen),
                   output=OutputSpec(uri=f"s3://{bucket}/out"), video=VideoSpec(segment_frames=4),
                   notify=notify)


def _keys(s3: S3Server, bucket: str, job_id: str) -> list[str]:
    listed = s3.client().list_objects_v2(Bucket=bucket, Prefix=f"out/e2e/{job_id}/previews/")
    return sorted(o["Key"].rsplit("/", 1)[1] for o in listed.get("Contents", []))


def _get(s3: S3Server, bucket: str, key: str) -> bytes:
    return bytes(s3.client().get_object(Bucket=bucket, Key=key)["Body"].read())


def _frames(data: bytes) -> list[Any]:
    with av.open(io.BytesIO(data)) as f:
        return [frame.to_ndarray(format="rgb24") for frame in f.decode(video=0)]


def _lines(handle: JobHandle) -> list[str]:
    """The distinct ``status`` lines of a job while it runs, until it ends."""
    seen: list[str] = []
    while handle.status() not in ("SUCCESS", "FAILURE", "REVOKED"):
        p = handle.progress()
        if p is not None and (not seen or seen[-1] != p.describe()):
            seen.append(p.describe())
        time.sleep(0.01)
    return seen


def _events(rx: Receiver, path: str) -> list[dict[str, Any]]:
    with rx.lock:
        return [r.json for r in rx.received if r.path == path]


def test_previews_in_order_to_the_receivers_that_ask(
        fleet: Fleet, s3: S3Server, s3_bucket: str, model: Path) -> None:
    with Receiver() as rx:
        client = fleet(rx.port, **_env(model, FRAMEFLEET_PREVIEW_EVERY="3"))
        # Given a job whose receiver asks for previews, one every 10 of its 100 steps
        asked = _spec("asked", s3_bucket, model, num_inference_steps=100, preview={"every": 10},
                      notify=NotifySpec(urls=(rx.url("/hook/asked"),),
                                        events=("preview", "succeeded")))
        handle = client.submit(asked)
        lines = _lines(handle)
        result = handle.wait(timeout=120)
        assert result.manifest.generate is not None
        published = result.manifest.generate.previews
        got = rx.wait(published + 1, timeout=30)
        # Then the receiver got each stored preview in step order, then the success. A preview
        # that finds the writer two behind is dropped (the next one comes): on a busy machine
        # the tiny model's steps outrun the encode and upload, so not all ten need be there
        events = _events(rx, "/hook/asked")
        assert [e["event"] for e in events] == ["preview"] * published + ["succeeded"], got
        shown = [e["data"]["preview"] for e in events[:-1]]
        steps = [p["step"] for p in shown]
        assert published >= 2 and steps == sorted(set(steps)), steps
        assert all(step == 1 or (step % 10 == 0 and 10 <= step <= 100)
                   for step in steps), steps
        # each stored under the job's output, decoding at the size and frame count it states
        prefix = f"s3://{s3_bucket}/out/e2e/asked/previews/"
        assert _keys(s3, s3_bucket, "asked") == ["latest.mp4", *(
            f"step-{n:04d}.mp4" for n in steps)]
        for p in shown:
            assert p["uri"] == f"{prefix}step-{p['step']:04d}.mp4"
            assert p["latest_uri"] == f"{prefix}latest.mp4"
            frames = _frames(_get(s3, s3_bucket, p["uri"].removeprefix(f"s3://{s3_bucket}/")))
            assert len(frames) == p["frames"] == 3
            assert frames[0].shape == (p["height"], p["width"], 3) == (16, 24, 3)
        assert _get(s3, s3_bucket, "out/e2e/asked/previews/latest.mp4") == _get(
            s3, s3_bucket, f"out/e2e/asked/previews/step-{steps[-1]:04d}.mp4")
        # the status line named them while it denoised, and the manifest counts them
        assert any(line.startswith("denoise ") and f", preview at {prefix}step-00" in line
                   for line in lines), lines
        assert result.manifest.generate.preview_every == 10
        assert result.timings.preview_s > 0

        # A receiver that did not ask gets no previews, though the job made them
        silent = _spec("silent", s3_bucket, model, num_inference_steps=10, preview={"every": 5},
                       notify=NotifySpec(urls=(rx.url("/hook/silent"),)))
        client.submit(silent).wait(timeout=120)
        rx.wait(published + 2, timeout=30)
        assert [e["event"] for e in _events(rx, "/hook/silent")] == ["succeeded"]
        assert _keys(s3, s3_bucket, "silent") == ["latest.mp4", "step-0001.mp4", "step-0005.mp4",
                                                  "step-0010.mp4"]

    # A job that does not say gets the worker's default (every 3: after steps 1, 3 and 6);
    # every 0 writes none
    client.submit(_spec("default", s3_bucket, model, num_inference_steps=6)).wait(timeout=120)
    assert _keys(s3, s3_bucket, "default") == ["latest.mp4", "step-0001.mp4", "step-0003.mp4",
                                               "step-0006.mp4"]
    off = client.submit(_spec("off", s3_bucket, model, num_inference_steps=6,
                              preview={"every": 0})).wait(timeout=120)
    assert _keys(s3, s3_bucket, "off") == []
    assert off.manifest.generate is not None and off.manifest.generate.preview_every == 0


def test_latest_is_whole_when_read_and_a_cancel_ends_the_previews(
        fleet: Fleet, s3: S3Server, s3_bucket: str, model: Path) -> None:
    with Receiver() as rx:
        client = fleet(rx.port, **_env(model))
        # Given a job that replaces latest.mp4 after each of its 150 steps, read meanwhile
        handle = client.submit(_spec("latest", s3_bucket, model, num_inference_steps=150,
                                     preview={"every": 1}))
        reads: list[bytes] = []
        done = threading.Event()

        def read() -> None:
            s3c = s3.client()
            while not done.is_set():
                try:
                    reads.append(bytes(s3c.get_object(
                        Bucket=s3_bucket, Key="out/e2e/latest/previews/latest.mp4")["Body"].read()))
                except s3c.exceptions.NoSuchKey:
                    time.sleep(0.01)

        thread = threading.Thread(target=read)
        thread.start()
        try:
            handle.wait(timeout=180)
        finally:
            done.set()
            thread.join()
        # Then every read got one whole clip, of many versions
        versions = set(reads)
        assert len(versions) >= 5, len(versions)
        assert all(len(_frames(data)) == 3 for data in versions)

        # When a job that makes previews is cancelled while it denoises
        url = rx.url("/hook/cancelled")
        handle = client.submit(_spec("cancelled", s3_bucket, model, num_inference_steps=1500,
                                     preview={"every": 5}, notify=NotifySpec(
                                         urls=(url,), events=("preview", "cancelled"))))
        rx.wait(3, timeout=120)  # three previews announced
        client.cancel("cancelled", "e2e")
        deadline = time.monotonic() + 60
        while handle.status() != "REVOKED":
            assert time.monotonic() < deadline, handle.status()
            time.sleep(0.05)
        stored = _keys(s3, s3_bucket, "cancelled")
        time.sleep(2)
        # Then nothing is stored or announced after its end: cancelled is the last event
        assert _keys(s3, s3_bucket, "cancelled") == stored and len(stored) >= 4
        events = _events(rx, "/hook/cancelled")
        assert [e["event"] for e in events[-1:]] == ["cancelled"], events
        announced = [f"step-{e['data']['preview']['step']:04d}.mp4" for e in events[:-1]]
        assert len(announced) >= 3 and set(announced) <= set(stored), (announced, stored)


def _metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith(name + " ")]
    return sum(values)


def test_a_store_outage_during_previews_still_ends_in_success(
        fleet: Fleet, s3: S3Server, s3_bucket: str, model: Path) -> None:
    # Given a worker whose S3 client does not retry by itself, and a long denoise
    port = free_port()
    client = fleet(**_env(model, FRAMEFLEET_S3_MAX_ATTEMPTS="1",
                          FRAMEFLEET_METRICS_PORT=str(port)))
    handle = client.submit(_spec("outage", s3_bucket, model, num_inference_steps=1200,
                                 preview={"every": 10}))
    deadline = time.monotonic() + 120
    while (p := handle.progress()) is None or p.preview is None:
        assert time.monotonic() < deadline and handle.status() != "SUCCESS", handle.status()
        time.sleep(0.02)
    # When SeaweedFS goes down while it denoises, until a few previews have failed
    s3.stop()
    try:
        deadline = time.monotonic() + 60
        while _metric(port, "framefleet_preview_failures_total") < 2:
            assert time.monotonic() < deadline and handle.status() != "SUCCESS"
            time.sleep(0.1)
        down_at = handle.progress()
        assert down_at is not None and down_at.stage == "denoise", down_at
    finally:
        s3.start()
    back_at = handle.progress()  # the store is back before the job needs it for its video
    assert back_at is not None and back_at.stage == "denoise", back_at
    # Then the job succeeds with its whole video, and the previews went on after the outage
    result = handle.wait(timeout=180)
    assert handle.status() == "SUCCESS"
    frames = 0
    for seg in result.manifest.segments:
        data = _get(s3, s3_bucket, seg.uri.removeprefix(f"s3://{s3_bucket}/"))
        frames += len(_frames(data))
        assert len(data) == seg.bytes
    assert frames == result.manifest.frames == 9
    failures = _metric(port, "framefleet_preview_failures_total")
    assert failures >= 2
    facts = result.manifest.generate
    # 121 made: after step 1, then every 10th of the 1200
    assert facts is not None and 0 < facts.previews <= 121 - failures
    stored = _keys(s3, s3_bucket, "outage")
    assert "step-1200.mp4" in stored and down_at.preview is not None
    assert f"step-{down_at.preview.step:04d}.mp4" in stored
