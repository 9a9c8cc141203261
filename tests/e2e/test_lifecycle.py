"""Cancellation and spot interruptions, through real workers, Redis and S3."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import redis

from producer.client import Client, JobHandle
from producer.errors import JobCancelled
from tests.e2e.helpers import pattern_spec, put_latents, verify_output
from tests.imds import ImdsStandIn

pytestmark = pytest.mark.e2e


@pytest.fixture
def client(redis_url: str) -> Client:
    redis.Redis.from_url(redis_url).flushdb()
    return Client(broker_url=redis_url, backend_url=redis_url)


def _wait_started(handle: JobHandle, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        p = handle.progress()
        if p is not None and p.frames_done > 0:
            return
        time.sleep(0.02)
    raise AssertionError(f"{handle.job_id} did not start within {timeout} s")


def _long_job(s3: Any, bucket: str, job_id: str, latent_frames: int = 150) -> Any:
    uri = put_latents(s3, bucket, f"in/{job_id}.npy", latent_frames=latent_frames, h=64, w=80,
                      fmt="npy")
    return pattern_spec(job_id, uri, bucket, segment_frames=32)


def test_cancel_running_and_queued_jobs(
    client: Client, worker_factory: Any, s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    (worker,) = worker_factory(1)
    running = client.submit(_long_job(s3, s3_bucket, "cancel-running"))
    queued = client.submit(_long_job(s3, s3_bucket, "cancel-queued", latent_frames=3))
    _wait_started(running)
    # When both are cancelled: the running one between chunks, the queued one before it runs
    client.cancel("cancel-queued")
    client.cancel("cancel-running")
    for handle in (running, queued):
        with pytest.raises(JobCancelled):
            handle.wait(timeout=60)
        assert handle.status() == "REVOKED"
    # Then neither left a manifest
    listed = s3.client().list_objects_v2(Bucket=s3_bucket, Prefix="out/").get("Contents", [])
    assert not [o for o in listed if o["Key"].endswith("manifest.json")]
    # and the worker takes the next job
    uri = put_latents(s3, s3_bucket, "in/after.npy", latent_frames=3, fmt="npy")
    after = client.submit(pattern_spec("after-cancel", uri, s3_bucket)).wait(timeout=60)
    verify_output(s3, s3_bucket, after, tmp_path)
    assert "cancel-running cancelled after" in worker.log_text()


def test_spot_notice_hands_the_job_to_another_worker(
    client: Client, worker_factory: Any, s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    with ImdsStandIn() as imds:
        # Given a spot worker that watches the (stand-in) metadata service, running a job
        (spot,) = worker_factory(1, env={"FRAMEFLEET_SPOT_WATCH": "true",
                                         "FRAMEFLEET_IMDS_URL": imds.url,
                                         "FRAMEFLEET_SPOT_POLL_S": "0.2"})
        handle = client.submit(_long_job(s3, s3_bucket, "spot-1"))
        _wait_started(handle)
        # When AWS posts the two-minute notice, and an on-demand worker is there
        imds.notice = {"action": "terminate", "time": "2026-11-29T12:00:00Z"}
        (ondemand,) = worker_factory(1)
        result = handle.wait(timeout=120)
        # Then the job was finished by the other worker, complete and exactly once
        assert result.worker.node == ondemand.nodename
        verify_output(s3, s3_bucket, result, tmp_path)
        assert "handed back" in spot.log_text()
        # and the reclaimed worker takes no new job
        uri = put_latents(s3, s3_bucket, "in/next.npy", latent_frames=3, fmt="npy")
        nxt = client.submit(pattern_spec("spot-next", uri, s3_bucket)).wait(timeout=60)
        assert nxt.worker.node == ondemand.nodename
