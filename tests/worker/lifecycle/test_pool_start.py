"""A worker replaces a lost pool process however long its start takes, and stops once, with
its own exit status, when no pool process can start: through real worker processes and Redis.

Celery kills a pool process that has not said it is up within ``worker_proc_alive_timeout``
(4 s by default); a framefleet pool process says so after its warm-up. Before the fix every
replacement of a SIGKILLed pool process with a warm-up model was killed about 4 s after it
started, for ever."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import redis

from producer.client import Client
from producer.wire.spec import DecoderSpec, InputSpec, JobSpec, OutputSpec
from tests.cpuload import busy_cores
from tests.services.celery_worker import WorkerProcess
from tests.waiting import wait_for
from tests.worker.generate.tiny import save_tiny_model
from worker.lifecycle.poolwatch import POOL_START_EXIT

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.e2e


def _pattern_job(tmp: Path, job_id: str) -> JobSpec:
    np.save(tmp / f"{job_id}.npy", np.zeros((16, 4, 4, 6), np.float32))
    return JobSpec(job_id=job_id, input=InputSpec(uri=(tmp / f"{job_id}.npy").as_uri()),
                   decoder=DecoderSpec(name="pattern"),
                   output=OutputSpec(uri=(tmp / "out").as_uri()))


def _pool_processes(launcher: int) -> list[psutil.Process]:
    """The pool processes under ``framefleet worker``: the Celery main process's children."""
    mains = [p for p in psutil.Process(launcher).children()
             if "celery" in " ".join(p.cmdline())]
    return [c for m in mains for c in m.children() if c.is_running()]


def _healthy(env: dict[str, str]) -> bool:
    done = subprocess.run([sys.executable, "-m", "producer.cli", "healthcheck"], env=env,
                          cwd=ROOT, capture_output=True, timeout=60)
    return done.returncode == 0


def test_a_lost_pool_process_is_replaced_with_a_warm_up_model_on_busy_cores(
    redis_url: str, tmp_path: Path
) -> None:
    redis.Redis.from_url(redis_url).flushdb()
    model = save_tiny_model(tmp_path / "tiny-wan")
    env = {**os.environ, "FRAMEFLEET_BROKER_URL": redis_url, "FRAMEFLEET_RESULT_BACKEND": redis_url,
           "FRAMEFLEET_WARMUP_MODEL": str(model), "FRAMEFLEET_FILE_ROOTS": str(tmp_path),
           "FRAMEFLEET_WORK_DIR": str(tmp_path), "FRAMEFLEET_METRICS_PORT": "0",
           "FRAMEFLEET_DEVICE": "cpu", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    log_path = tmp_path / "worker.log"
    with busy_cores(limit_s=300), log_path.open("wb") as log:
        # Given `framefleet worker --cpu 1` with a warm-up model, ready, on a machine whose
        # cores are all busy
        launcher = subprocess.Popen([sys.executable, "-m", "producer.cli", "worker", "--cpu", "1"],
                                    cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        try:
            wait_for(lambda: _healthy(env) or None, 180, "the worker ready", interval=1.0)
            (old,) = _pool_processes(launcher.pid)
            # When its pool process is SIGKILLed
            os.kill(old.pid, signal.SIGKILL)
            killed = time.monotonic()
            new = wait_for(lambda: [p for p in _pool_processes(launcher.pid)
                                    if p.pid != old.pid] or None, 60, "a new pool process")
            # Then the replacement warms up and becomes ready (it lives well past Celery's 4 s)
            wait_for(lambda: _healthy(env) or None, 180, "the replacement ready", interval=1.0)
            ready_s = time.monotonic() - killed
            assert all(p.is_running() for p in new)
            # and runs the next job
            client = Client(broker_url=redis_url, backend_url=redis_url)
            result = client.submit(_pattern_job(tmp_path, "after-kill")).wait(timeout=120)
            assert result.manifest.frames == 13
            assert [p.pid for p in _pool_processes(launcher.pid)] == [p.pid for p in new]
        finally:
            os.killpg(launcher.pid, signal.SIGTERM)
            try:
                launcher.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(launcher.pid, signal.SIGKILL)
                launcher.wait(timeout=10)
    text = log_path.read_text(errors="replace")
    assert "Timed out waiting for UP message" not in text, text[-3000:]
    print(f"replacement ready {ready_s:.1f} s after the SIGKILL (busy cores)")


class SlowStartWorker(WorkerProcess):
    """A real worker whose pool processes sleep ``FRAMEFLEET_TEST_START_S`` in their start."""

    def argv(self) -> list[str]:
        argv = super().argv()
        argv[argv.index("-A") + 1] = "tests.worker.lifecycle.slow_start_worker"
        return argv


def _slow_worker(name: str, tmp_path: Path, redis_url: str, **env: str) -> SlowStartWorker:
    return SlowStartWorker(name, tmp_path / "workers", {
        "FRAMEFLEET_BROKER_URL": redis_url, "FRAMEFLEET_RESULT_BACKEND": redis_url,
        "FRAMEFLEET_DEVICE": "cpu", "FRAMEFLEET_METRICS_PORT": "0",
        "FRAMEFLEET_FILE_ROOTS": str(tmp_path), "FRAMEFLEET_WORK_DIR": str(tmp_path), **env})


def test_a_slow_start_gets_its_time(tmp_path: Path, redis_url: str) -> None:
    redis.Redis.from_url(redis_url).flushdb()
    # Given pool processes that need 8 s to start (Celery's own limit is 4 s)
    w = _slow_worker("slow", tmp_path, redis_url, FRAMEFLEET_TEST_START_S="8")
    w.start()
    try:
        w.wait_ready(60)
        # When a job is sent
        client = Client(broker_url=redis_url, backend_url=redis_url)
        result = client.submit(_pattern_job(tmp_path, "slow-start")).wait(timeout=120)
        # Then the first pool process was given its 8 s and ran it
        assert result.manifest.frames == 13
        assert "Timed out waiting for UP message" not in w.log_text()
    finally:
        w.stop()


def test_a_pool_process_that_never_starts_stops_the_worker_once(
    tmp_path: Path, redis_url: str
) -> None:
    redis.Redis.from_url(redis_url).flushdb()
    # Given pool processes that cannot start within the start timeout (2 s)
    w = _slow_worker("stuck", tmp_path, redis_url, FRAMEFLEET_TEST_START_S="120",
                     FRAMEFLEET_POOL_START_TIMEOUT_S="2")
    w.start()
    try:
        # When the worker runs
        assert w.proc is not None
        proc = w.proc
        code = wait_for(lambda: proc.poll(), 120, "the worker to stop", interval=0.2)
        # Then it stops by itself with its own status after three starts in a row failed,
        # saying so once, instead of replacing its pool process for ever
        text = w.log_text()
        assert code == POOL_START_EXIT, text[-3000:]
        assert text.count("could not start 3 times in a row") == 1, text[-3000:]
        assert text.count("ended before it was up") == 3, text[-3000:]
        # (Celery may start one more pool process while it shuts down; it is not waited for)
        assert "ForkPoolWorker-5" not in text, text[-3000:]
    finally:
        w.stop()
