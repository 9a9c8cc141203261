"""End to end: producer → Redis → real Celery workers → SeaweedFS S3 → JobResult."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from producer.app import TASK_NAME
from producer.client import Client
from producer.errors import JobConflictError, JobFailed
from tests.e2e.helpers import pattern_spec, put_latents, verify_output

pytestmark = pytest.mark.e2e


@pytest.fixture
def client(redis_url: str) -> Client:
    redis.Redis.from_url(redis_url).flushdb()  # no job of an earlier test is left queued
    return Client(broker_url=redis_url, backend_url=redis_url)


def test_five_jobs_through_two_workers(
    client: Client, worker_factory: Any, s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    # Given two worker processes and five jobs of different lengths in S3
    workers = worker_factory(2)
    specs = []
    for i in range(5):
        uri = put_latents(s3, s3_bucket, f"in/job{i}.safetensors", latent_frames=6 + 3 * i,
                          h=32, w=40)
        specs.append(pattern_spec(f"five-{i}", uri, s3_bucket, segment_frames=10))
    # When all are submitted at once
    handles = [client.submit(spec) for spec in specs]
    results = [h.wait(timeout=180) for h in handles]
    # Then every job succeeded, its objects match its manifest, and every frame is there once
    for spec, result in zip(specs, results, strict=True):
        assert result.manifest.job_id == spec.job_id
        assert result.manifest.frames == 1 + 4 * (6 + 3 * int(spec.job_id[-1]) - 1)
        assert (result.manifest.width, result.manifest.height) == (320, 256)
        verify_output(s3, s3_bucket, result, tmp_path)
        assert result.timings.wall_s > 0 and result.timings.encode_s > 0
    # and both workers took part
    assert {r.worker.node for r in results} == {w.nodename for w in workers}


def test_same_job_id_twice_runs_once(
    client: Client, worker_factory: Any, s3: Any, s3_bucket: str
) -> None:
    (worker,) = worker_factory(1)
    uri = put_latents(s3, s3_bucket, "in/dup.npy", latent_frames=4, fmt="npy")
    spec = pattern_spec("dup-1", uri, s3_bucket)
    first = client.submit(spec).wait(timeout=60)
    # Submitting the same job again returns the existing job instead of running it again
    again = client.submit(spec).wait(timeout=60)
    assert again == first
    assert worker.log_text().count(f"Task {TASK_NAME}[dup-1] received") == 1
    # A different spec under the same job_id is refused before it reaches the queue
    with pytest.raises(JobConflictError, match="dup-1"):
        client.submit(pattern_spec("dup-1", uri, s3_bucket, segment_frames=5))


def test_bad_input_fails_fast_and_worker_stays_healthy(
    client: Client, worker_factory: Any, s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    (worker,) = worker_factory(1)
    s3.client().put_object(Bucket=s3_bucket, Key="in/evil.npy", Body=b"\x80\x04K\x01.")
    bad = client.submit(pattern_spec("bad-1", f"s3://{s3_bucket}/in/evil.npy", s3_bucket))
    with pytest.raises(JobFailed, match="evil.npy") as info:
        bad.wait(timeout=60)
    assert info.value.kind == "InvalidJobError"
    missing = client.submit(pattern_spec("bad-2", f"s3://{s3_bucket}/in/none.npy", s3_bucket))
    with pytest.raises(JobFailed, match="none.npy"):
        missing.wait(timeout=60)
    # No retry loop: each bad job ran once, and no manifest was written
    assert worker.log_text().count("Retry in") == 0
    keys = s3.client().list_objects_v2(Bucket=s3_bucket, Prefix="out/").get("KeyCount", 0)
    assert keys == 0
    # The worker then completes a good job
    uri = put_latents(s3, s3_bucket, "in/good.npy", latent_frames=3, fmt="npy")
    good = client.submit(pattern_spec("good-1", uri, s3_bucket)).wait(timeout=60)
    verify_output(s3, s3_bucket, good, tmp_path)


def test_progress_and_cli(
    client: Client, worker_factory: Any, worker_env: dict[str, str], s3: Any, s3_bucket: str
) -> None:
    worker_factory(1)
    uri = put_latents(s3, s3_bucket, "in/cli.safetensors", latent_frames=30, h=64, w=64)
    spec = pattern_spec("cli-1", uri, s3_bucket, segment_frames=16)
    handle = client.submit(spec)
    seen = []
    while handle.status() not in {"SUCCESS", "FAILURE"}:
        p = handle.progress()
        if p is not None:
            seen.append(p.frames_done)
    assert handle.status() == "SUCCESS"
    assert seen == sorted(seen)
    env = {**os.environ, **worker_env}
    cli = [sys.executable, "-m", "producer.cli"]
    out = subprocess.run([*cli, "status", "cli-1"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "cli-1: SUCCESS" in out.stdout
    out = subprocess.run([*cli, "wait", "cli-1", "--json"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert '"frames": 117' in out.stdout
