"""The stuck-job watchdog, end to end: a job that hangs is noticed, explained and ended.

Real Redis, SeaweedFS and a Celery worker process (``tests.e2e.stuck_worker``: its decoder
hangs on a job's third chunk while a marker file exists). With ``FRAMEFLEET_STUCK_S`` small,
the hung run's pool process dumps every thread's stack into the worker's log and is retired;
Celery replaces it and delivers the job once more, and that delivery fails it "stuck in
decode" and counts it in ``framefleet_jobs_stuck_total``.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis

from producer.client import Client
from producer.errors import JobFailed
from tests.e2e.chaos_helpers import received
from tests.e2e.helpers import pattern_spec, put_latents
from tests.services import WorkerProcess, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

#: Seconds without progress: far above a healthy gap of this tiny job, even on a loaded machine.
STUCK_S = 6


def _metric(port: int, name: str, **labels: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{")
               and all(f'{k}="{v}"' in line for k, v in labels.items()))


def test_a_hung_job_dumps_its_stacks_retires_its_process_and_fails_stuck_in_its_stage(
    redis_url: str, s3: Any, s3_bucket: str, tmp_path: Path, worker_env: dict[str, str]
) -> None:
    redis.Redis.from_url(redis_url).flushdb()
    marker = tmp_path / "hang"
    marker.touch()
    port = free_port()
    w = WorkerProcess("stuck", tmp_path / "workers", {
        **worker_env, "FRAMEFLEET_TEST_APP": "tests.e2e.stuck_worker",
        "FRAMEFLEET_DEVICE": "cpu", "OMP_NUM_THREADS": "1", "FRAMEFLEET_METRICS_PORT": str(port),
        "FRAMEFLEET_STUCK_S": str(STUCK_S), "FRAMEFLEET_TEST_HANG": str(marker)})
    w.start()
    try:
        w.wait_ready(60)
        (first,) = psutil.Process(w.pid).children()
        client = Client(broker_url=redis_url, backend_url=redis_url)
        latents = put_latents(s3, s3_bucket, "in/z.npy", latent_frames=8, fmt="npy")
        # Given a job whose run hangs after two decoded chunks
        handle = client.submit(pattern_spec("hangs", latents, s3_bucket, segment_frames=4))
        # When it has waited, it ends in FAILURE saying where it stopped
        with pytest.raises(JobFailed) as failed:
            handle.wait(timeout=180)
        assert failed.value.kind == "JobStuck", failed.value
        message = failed.value.message
        assert "stuck in decode" in message and f"FRAMEFLEET_STUCK_S={STUCK_S}" in message
        assert str(w.nodename) in message, message
        log = w.log_text()
        # its pool process logged why, dumped every thread's stack (the hung one's frame
        # in it) and was retired: replaced by a new one
        assert log.count("stuck in decode: no progress for") == 1, log[-4000:]
        dump = log.split("stuck in decode: no progress for", 1)[1]
        assert "(most recent call first)" in dump and "_hang_forever" in dump, dump[:4000]
        assert "WorkerLostError" in log and "exitcode 70" in log, log[-4000:]
        assert not first.is_running()
        (second,) = psutil.Process(w.pid).children()
        assert second.pid != first.pid
        # it was delivered once more, and that delivery failed it without running
        assert received([w], "hangs") == 2
        # counted once, by the process that lives on
        assert _metric(port, "framefleet_jobs_stuck_total", stage="decode") == 1
        assert _metric(port, "framefleet_jobs_total", status="failure", reason="JobStuck") == 1
        # and the worker goes on with the next job, in the new process
        marker.unlink()
        after = client.submit(pattern_spec("after-hang", latents, s3_bucket, segment_frames=4))
        assert after.wait(timeout=120).worker.pid == second.pid
        assert w.running
    finally:
        w.stop()
