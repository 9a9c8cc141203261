"""A Celery revoke is a framefleet cancel (the id runs again when submitted again); a queued
job says why it waits; ``status`` names the stage and the worker; ``doctor`` counts live
workers. Real Redis, SeaweedFS and Celery workers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import pytest
import redis

from producer.client import Client
from producer.errors import JobCancelled
from producer.wire.spec import JobSpec
from tests.e2e.chaos_helpers import LONG_JOB, wait_for
from tests.e2e.helpers import pattern_spec, put_latents
from tests.services import REPO_ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
WORKER_ENV = {"FRAMEFLEET_DEVICE": "cpu", "OMP_NUM_THREADS": "1"}


@pytest.fixture
def client(redis_url: str) -> Client:
    redis.Redis.from_url(redis_url).flushdb()
    return Client(broker_url=redis_url, backend_url=redis_url)


def _long(s3: Any, bucket: str, job_id: str, latent_frames: int = 60) -> JobSpec:
    """237 frames of 512x384 (≈ 1.5 s on an idle core), or more with ``latent_frames``."""
    uri = put_latents(s3, bucket, f"in/{job_id}.safetensors", latent_frames,
                      LONG_JOB["h"], LONG_JOB["w"])
    return pattern_spec(job_id, uri, bucket, segment_frames=LONG_JOB["segment_frames"])


def _run(redis_url: str, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("FRAMEFLEET_")}
    return subprocess.run([sys.executable, "-m", *argv], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120, env={**base, "PYTHONPATH": str(REPO_ROOT),
                                                       "COLUMNS": "200",
                                                       "FRAMEFLEET_BROKER_URL": redis_url,
                                                       **env})


def _celery_revoke(redis_url: str, *keys: str) -> None:
    """What Flower's revoke button sends: Celery's remote-control revoke, to every worker."""
    out = _run(redis_url, "celery", "-A", "producer.ops.dashboard", "control", "revoke", *keys)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_celery_revoked_id_runs_again_when_resubmitted(
    client: Client, redis_url: str, worker_factory: Any, s3: Any, s3_bucket: str
) -> None:
    (worker,) = worker_factory(1, env=WORKER_ENV)
    # (long enough, ≈ 6 s, for the celery command to start while it runs)
    running, queued = _long(s3, s3_bucket, "rv-1", 240), _long(s3, s3_bucket, "rv-2")
    first = client.submit(running)
    second = client.submit(queued)  # waits behind rv-1: one job at a time
    wait_for(lambda: first.state().state == "PROGRESS" or None, 60, "rv-1 mid-way")
    # When Celery revokes the running job and the queued one (Flower's button, the CLI)
    _celery_revoke(redis_url, "rv-1", "rv-2")
    # Then both end REVOKED, as a framefleet cancel ends them
    for handle in (first, second):
        with pytest.raises(JobCancelled):
            handle.wait(timeout=60)
        assert handle.state().state == "REVOKED"
    # and no worker keeps the ids: Celery's list of revoked ids stays empty
    revoked = client.app.control.inspect(timeout=2).revoked() or {}
    assert revoked and all(not ids for ids in revoked.values()), revoked
    # When both are submitted again, both run to the end
    for spec, frames in ((running, 957), (queued, 237)):
        result = client.submit(spec).wait(timeout=120)
        assert result.manifest.frames == frames and not result.reused
    assert "Discarding revoked task" not in worker.log_text()


def test_a_queued_job_says_why_it_waits_and_doctor_counts_workers(
    client: Client, redis_url: str, worker_factory: Any, s3: Any, s3_bucket: str
) -> None:
    hint_env = {"FRAMEFLEET_IDLE_HINT_S": "1", "FRAMEFLEET_RESULT_BACKEND": redis_url}
    # Given a job submitted while no worker runs
    spec = _long(s3, s3_bucket, "lonely-1")
    client.submit(spec)

    def hint() -> str | None:
        out = _run(redis_url, "producer.cli", "status", "lonely-1", **hint_env)
        return out.stderr if out.returncode == 0 and "hint:" in out.stderr else None

    # Then status says it waits, that no worker took a job, and that none is alive
    text = " ".join(wait_for(hint, 30, "a hint from status").split())
    assert text.startswith("hint: no worker has taken a job since Redis kept count (this one "
                           "waits "), text
    assert "no worker answers a ping: start one (framefleet worker)" in text
    # and doctor says no worker is alive
    doctor = _run(redis_url, "producer.cli", "doctor", **hint_env)
    assert "WARN live workers: none answered a ping within 2 s" in doctor.stdout, doctor.stdout
    # When a worker starts, the job runs; status names its stage and its worker
    (worker,) = worker_factory(1, env=WORKER_ENV)
    handle = client.get("lonely-1")
    seen: set[str] = set()
    while not (js := handle.state()).finished:
        if js.state == "PROGRESS":
            assert js.worker == worker.nodename, js
            seen.add(js.detail().split(" ", 1)[0].rstrip(":"))
        time.sleep(0.01)
    assert js.state == "SUCCESS" and {"decode", "upload"} <= seen, seen
    # and doctor counts it; a queued job no longer gets a hint (a worker took one just now)
    doctor = _run(redis_url, "producer.cli", "doctor", **hint_env)
    assert f"OK   live workers: 1 answered a ping: {worker.nodename}" in doctor.stdout
    client.submit(_long(s3, s3_bucket, "busy-2"))
    status = _run(redis_url, "producer.cli", "status", "busy-2", **hint_env)
    assert "hint:" not in status.stderr
