"""The first hour of a new user, through real Redis, SeaweedFS and Celery workers.

No noise passed off as a video, no job_id stuck forever, configuration errors fatal at once,
and a retrying job that says why.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from producer.app import TASK_NAME
from producer.client import Client, JobHandle
from producer.errors import JobCancelled, JobFailed, UnknownJobError
from producer.wire.spec import JobSpec
from tests.e2e.helpers import pattern_spec, put_latents, verify_output
from tests.services import REPO_ROOT, free_port

pytestmark = pytest.mark.e2e


@pytest.fixture
def client(redis_url: str) -> Client:
    redis.Redis.from_url(redis_url).flushdb()
    return Client(broker_url=redis_url, backend_url=redis_url)


def _wan(job_id: str, uri: str, bucket: str, **decoder: str) -> JobSpec:
    return JobSpec.model_validate({
        "job_id": job_id, "input": {"uri": uri}, "output": {"uri": f"s3://{bucket}/out"},
        "decoder": {"name": "wan2.1-vae", "preset": "tiny", **decoder},
    })


def _failure(handle: JobHandle, timeout: float = 30) -> JobFailed:
    with pytest.raises(JobFailed) as info:
        handle.wait(timeout=timeout)
    return info.value


def test_no_weights_and_a_missing_folder_fail_at_once_naming_the_field(
    client: Client, worker_factory: Any, s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    (worker,) = worker_factory(1, env={"FRAMEFLEET_FILE_ROOTS": str(tmp_path)})
    uri = put_latents(s3, s3_bucket, "in/w.npy", latent_frames=2, fmt="npy")
    # A producer that bypasses the client still cannot get noise without asking for it
    raw = _wan("no-weights", uri, s3_bucket).model_dump(mode="json")
    task_id = "no-weights"  # its key, as a raw sender must use (any other id fails first)
    client.app.send_task(TASK_NAME, args=[raw], task_id=task_id)
    err = _failure(JobHandle(client.app, task_id))
    assert err.kind == "InvalidJobError" and err.message.startswith("decoder.weights: ")
    # A folder that is not on the worker: a plain "no such folder", no model-hub talk
    folder = tmp_path / "models" / "wan2.1" / "vae"
    err = _failure(client.submit(_wan("no-folder", uri, s3_bucket, weights=folder.as_uri())))
    assert f"decoder.weights: no such folder: {folder.as_uri()}" in err.message
    assert "hub" not in err.message.lower() and "huggingface" not in err.message.lower()
    # Random weights, asked for by name, run and say so
    noise = client.submit(_wan("noise", uri, s3_bucket, weights="random")).wait(timeout=120)
    assert noise.random_weights and noise.manifest.random_weights
    body = s3.client().get_object(Bucket=s3_bucket, Key="out/default/noise/manifest.json")
    assert b'"random_weights": true' in body["Body"].read()
    # None of it was retried, and the worker goes on
    assert "Retry in" not in worker.log_text() and worker.running


def _long_job(s3: Any, bucket: str, job_id: str) -> JobSpec:
    # Long enough to be cancelled mid-run (a few seconds), short enough to run again.
    uri = put_latents(s3, bucket, f"in/{job_id}.npy", latent_frames=60, h=32, w=40, fmt="npy")
    return pattern_spec(job_id, uri, bucket, segment_frames=32)


def test_cancel_refuses_unknown_ids_and_a_cancelled_job_runs_again_when_resubmitted(
    client: Client, worker_factory: Any, s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    worker_factory(1)
    # Cancelling an id nobody submitted is refused, so that id is not poisoned ...
    with pytest.raises(UnknownJobError):
        client.cancel("fresh-id")
    uri = put_latents(s3, s3_bucket, "in/fresh.npy", latent_frames=3, fmt="npy")
    fresh = client.submit(pattern_spec("fresh-id", uri, s3_bucket)).wait(timeout=60)
    verify_output(s3, s3_bucket, fresh, tmp_path)
    # ... and a job cancelled while it runs ends REVOKED, with no manifest
    spec = _long_job(s3, s3_bucket, "again-1")
    handle = client.submit(spec)
    deadline = time.monotonic() + 60
    while handle.state().state != "PROGRESS":
        assert time.monotonic() < deadline, handle.state()
        time.sleep(0.02)
    assert client.cancel("again-1") in {"PROGRESS", "STARTED"}
    with pytest.raises(JobCancelled):
        handle.wait(timeout=60)
    assert client.state("again-1").state == "REVOKED"
    # When the same spec is submitted again, it runs, complete
    result = client.submit(spec).wait(timeout=120)
    assert not result.reused
    verify_output(s3, s3_bucket, result, tmp_path)


def test_missing_s3_credentials_fail_at_once_without_retries(
    client: Client, worker_factory: Any, s3: Any, s3_bucket: str
) -> None:
    # A worker with no credentials anywhere (and no instance metadata to ask)
    (worker,) = worker_factory(1, env={
        "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/credentials",
        "AWS_CONFIG_FILE": "/nonexistent/config", "AWS_EC2_METADATA_DISABLED": "true",
        "FRAMEFLEET_RETRY_BACKOFF_S": "30",
    })
    uri = put_latents(s3, s3_bucket, "in/c.npy", latent_frames=2, fmt="npy")
    t0 = time.monotonic()
    err = _failure(client.submit(pattern_spec("no-creds", uri, s3_bucket)))
    assert time.monotonic() - t0 < 15  # no back-off of 30 s, let alone five of them
    assert err.kind == "StorageConfigError" and "credentials" in err.message
    assert "Retry in" not in worker.log_text()


def test_a_retrying_job_shows_retry_and_its_reason(
    client: Client, worker_factory: Any, s3: Any, s3_bucket: str
) -> None:
    # A worker whose object store is down: every attempt is a retryable StorageError
    worker_factory(1, env={"FRAMEFLEET_S3_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",
                           "FRAMEFLEET_S3_MAX_ATTEMPTS": "1",
                           "FRAMEFLEET_RETRY_BACKOFF_S": "60"})
    uri = put_latents(s3, s3_bucket, "in/r.npy", latent_frames=2, fmt="npy")
    handle = client.submit(pattern_spec("retrying", uri, s3_bucket))
    seen = []
    deadline = time.monotonic() + 30
    while (js := handle.state()).state != "RETRY":
        seen.append(js.state)
        assert time.monotonic() < deadline, seen
        time.sleep(0.02)
    assert js.reason is not None and js.reason.startswith("StorageError: S3 unreachable")
    assert js.describe().startswith("retrying: StorageError: S3 unreachable")
    assert "UNKNOWN" not in seen  # QUEUED (and maybe STARTED) before it, never unknown
    client.cancel("retrying")


def test_the_demo_says_it_uses_random_weights(tmp_path: Path) -> None:
    fleet_ledger = tmp_path / "fleet-ledger"
    fleet_ledger.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAMEFLEET_")}
    out = subprocess.run(
        [sys.executable, "-m", "producer.cli", "demo", "--frames", "5", "--width", "32",
         "--height", "32", "--out", str(tmp_path / "demo")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
        env={**env, "PYTHONPATH": str(REPO_ROOT), "FRAMEFLEET_METRICS_PORT": "0",
             # a fleet's ledger in this shell: the demo's run must not land among its jobs
             "FRAMEFLEET_LEDGER_URI": fleet_ledger.as_uri(),
             "FRAMEFLEET_FILE_ROOTS": str(tmp_path)})
    assert out.returncode == 0, out.stdout + out.stderr
    assert not any(p.is_file() for p in fleet_ledger.rglob("*"))
    own = [p for p in (tmp_path / "demo" / ".framefleet" / "ledger").rglob("*") if p.is_file()]
    assert own, "the demo's run is in its own ledger"
    assert out.stdout.startswith('demo: random weights (decoder.weights "random")')
    assert out.stdout.splitlines()[-1].endswith("(wan2.1-vae, 32x32, random weights: noise)")
    (manifest,) = (tmp_path / "demo" / "videos" / "demo").glob("*/manifest.json")
    assert '"random_weights": true' in manifest.read_text()
