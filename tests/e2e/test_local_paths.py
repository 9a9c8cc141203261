"""Local paths and reused ids as the README's user meets them: refused at submit where the
producer knows the roots, one log line on the worker where it does not, and a conflict that
names the field. Real Redis and a Celery worker; the CLI as a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from producer.client import Client
from producer.errors import JobFailed
from tests.services import REPO_ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def _cli(redis_url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("FRAMEFLEET_")}
    return subprocess.run([sys.executable, "-m", "producer.cli", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**base, "PYTHONPATH": str(REPO_ROOT), "COLUMNS": "200",
                               "FRAMEFLEET_BROKER_URL": redis_url, **env})


@pytest.fixture
def latents(tmp_path: Path) -> Path:
    (tmp_path / "jobs").mkdir()
    path = tmp_path / "jobs" / "z.npy"
    np.save(path, np.zeros((16, 2, 4, 6), np.float32))
    return path


def test_a_path_outside_the_workers_roots(
    redis_url: str, worker_factory: Any, tmp_path: Path, latents: Path
) -> None:
    redis.Redis.from_url(redis_url).flushdb()
    (worker,) = worker_factory(1, env={"FRAMEFLEET_FILE_ROOTS": str(tmp_path / "jobs"),
                                       "FRAMEFLEET_DEVICE": "cpu"})
    elsewhere = tmp_path / "elsewhere"
    args = ["submit", "--input", str(latents), "--decoder", "pattern", "--job-id"]
    # With FRAMEFLEET_FILE_ROOTS set where the producer runs: refused before anything queues
    refused = _cli(redis_url, *args, "paths-1", "--output", str(elsewhere),
                   FRAMEFLEET_FILE_ROOTS=str(tmp_path / "jobs"))
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        f"error: --output: {elsewhere.as_uri()} is outside FRAMEFLEET_FILE_ROOTS "
        f"({tmp_path / 'jobs'}), so the workers would refuse it; use a folder under the roots, "
        "or add one to FRAMEFLEET_FILE_ROOTS here and on the workers")
    assert not redis.Redis.from_url(redis_url).exists("framefleet:spec:paths-1")
    # Without it: queued, with a warning that the workers decide ...
    queued = _cli(redis_url, *args, "paths-2", "--output", str(elsewhere))
    assert queued.returncode == 0 and queued.stdout.strip() == "paths-2"
    assert queued.stderr.startswith("warning: --input, --output: local paths on the workers")
    # ... and the worker refuses it: FAILURE naming the field and the rule
    client = Client(broker_url=redis_url, backend_url=redis_url)
    with pytest.raises(JobFailed) as info:
        client.get("paths-2").wait(timeout=60)
    assert info.value.kind == "PathRefusedError"
    assert info.value.message == (f"output.uri: {elsewhere.as_uri()}/default/paths-2 is "
                                  "outside the folders this worker may use "
                                  "(FRAMEFLEET_FILE_ROOTS)")
    # in one log line with the job id, no traceback; and the worker goes on
    lines = [line for line in worker.log_text().splitlines() if "paths-2" in line]
    failed = [line for line in lines if "PathRefusedError" in line]
    assert len(failed) == 1 and "decode_video[paths-2] raised expected" in failed[0], lines
    assert "Traceback" not in worker.log_text()
    inside = _cli(redis_url, *args, "paths-3", "--output", str(tmp_path / "jobs" / "out"),
                  "--wait")
    assert inside.returncode == 0, inside.stderr
    assert "SUCCESS paths-3: 5 frames" in inside.stdout


def test_a_reused_job_id_names_the_fields_that_differ(redis_url: str, latents: Path) -> None:
    redis.Redis.from_url(redis_url).flushdb()
    args = ["submit", "--input", latents.as_uri(), "--output", "s3://videos/out",
            "--decoder", "pattern", "--job-id", "same-id", "--tenant", "acme"]
    assert _cli(redis_url, *args).returncode == 0
    again = _cli(redis_url, *args, "--crf", "30", "--priority", "9")
    assert again.returncode == 1
    assert again.stderr.strip() == (
        "error: job_id 'same-id' of tenant 'acme' was already submitted with a different "
        "spec: --priority: 5 -> 9; --crf: 20 -> 30; use another job_id, or the first spec")
    assert _cli(redis_url, *args).stdout.strip() == "acme:same-id"  # the same spec: the job
