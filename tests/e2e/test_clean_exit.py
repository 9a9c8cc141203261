"""A worker asked to stop exits 0 and leaves nothing behind: a real Celery worker process with
a tiny model (its warm-up model, then one generate job with previews), then SIGTERM to its main
process (Celery's warm shutdown). Real Redis and SeaweedFS."""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis

from producer.client import Client
from producer.wire.generation import PreviewSpec
from producer.wire.spec import JobSpec, OutputSpec, VideoSpec
from tests.services import WorkerProcess, free_port
from tests.worker.generate.tiny import save_tiny_model, tiny_generate

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_a_worker_stopped_after_a_job_exits_0_with_a_clean_log(
    redis_url: str, s3: Any, s3_bucket: str, tmp_path: Path, worker_env: dict[str, str]
) -> None:
    redis.Redis.from_url(redis_url).flushdb()
    model = save_tiny_model(tmp_path / "tiny")
    w = WorkerProcess("clean", tmp_path / "workers", {
        **worker_env, "FRAMEFLEET_DEVICE": "cpu", "OMP_NUM_THREADS": "1",
        "FRAMEFLEET_FILE_ROOTS": str(tmp_path), "FRAMEFLEET_WARMUP_MODEL": str(model),
        "FRAMEFLEET_METRICS_PORT": str(free_port()), "FRAMEFLEET_STUCK_S": "120"})
    w.start()
    try:
        w.wait_ready(180)
        (pool,) = psutil.Process(w.pid).children()
        # Given a worker that ran a generate job (previews, segments, metrics served)
        client = Client(broker_url=redis_url, backend_url=redis_url)
        gen = tiny_generate(model, preview=PreviewSpec(every=1))
        spec = JobSpec(job_id="clean-1", generate=gen,
                       output=OutputSpec(uri=f"s3://{s3_bucket}/out"),
                       video=VideoSpec(segment_frames=4))
        assert client.submit(spec).wait(timeout=120).manifest.frames == 9
        # When it is asked to stop (SIGTERM to its main process: a warm shutdown)
        w.kill(signal.SIGTERM, group=False)
        assert w.proc is not None
        status = w.proc.wait(60)
        # Then it exits 0, its pool process with it, and says nothing went wrong
        assert status == 0, w.log_text()[-4000:]
        assert not pool.is_running() or pool.status() == psutil.STATUS_ZOMBIE
        log = w.log_text()
        for bad in ("terminate called", "Traceback", "ERROR/", "CRITICAL/",
                    "threads left running"):
            assert bad not in log, f"{bad!r} in the log:\n{log[-4000:]}"
        assert re.search(r"pool process \d+ stopped", log), log[-4000:]
    finally:
        w.stop()
