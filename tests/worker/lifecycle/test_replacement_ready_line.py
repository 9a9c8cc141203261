"""The ready line of a pool process started to replace a dead one tells its own start: its
``imports`` about 0 (it forks from an already-imported parent) and its total from its own
fork, not the main process's age. Through a real Celery worker and Redis.

Before the fix a replacement counted from the main process's start: a worker up for a minute
logged ``imports 64.3 s`` for a pool process forked a second before."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import redis

from tests.services.celery_worker import REPO_ROOT, WorkerProcess
from tests.waiting import wait_for
from worker.lifecycle.startphases import started_at

pytestmark = pytest.mark.e2e
READY = re.compile(r"framefleet worker process ready on \S+ \(metrics port \S+\), "
                   r"([0-9.]+) s after its start: (.*)$", re.M)
#: The main process's age before the kill: a replacement counted from it would say as much.
MAIN_AGE_S = 20.0
NODE = "replaced"


def _fleet(work_dir: Path, redis_url: str) -> str:
    env = {**os.environ, "FRAMEFLEET_WORK_DIR": str(work_dir), "FRAMEFLEET_BROKER_URL": redis_url}
    out = subprocess.run([sys.executable, "-m", "producer.cli", "fleet"], env=env, cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=60, check=True)
    return out.stdout


def _ready_lines(w: WorkerProcess) -> list[tuple[float, dict[str, float]]]:
    """Each ready line's total and its critical path's phases (those of 0.05 s or more)."""
    return [(float(total), {k: float(v) for k, v in re.findall(
        r"(\w+) ([0-9.]+) s", rest.split(" (the critical path)")[0])})
            for total, rest in READY.findall(w.log_text())]


def test_a_replacements_ready_line_counts_from_its_own_fork(
        tmp_path: Path, redis_url: str) -> None:
    redis.Redis.from_url(redis_url).flushdb()
    w = WorkerProcess(NODE, tmp_path / "workers", {
        "FRAMEFLEET_BROKER_URL": redis_url, "FRAMEFLEET_RESULT_BACKEND": redis_url,
        "FRAMEFLEET_DEVICE": "cpu", "FRAMEFLEET_METRICS_PORT": "0",
        "FRAMEFLEET_FILE_ROOTS": str(tmp_path), "FRAMEFLEET_WORK_DIR": str(tmp_path)})
    w.start()
    try:
        # Given a ready worker whose main process has run for a while
        w.wait_ready(120)
        assert w.proc is not None
        main = psutil.Process(w.proc.pid)
        main_start = started_at(main.pid)
        assert main_start is not None
        wait_for(lambda: time.time() - main_start >= MAIN_AGE_S or None, 120,
                 "the main process's age", interval=0.5)
        (first,) = wait_for(lambda: _ready_lines(w) or None, 60, "the first ready line")
        # (and `framefleet fleet` names its Celery node, as Flower and the logs do)
        shown = _fleet(tmp_path, redis_url)
        assert f"({NODE}@{socket.gethostname()}): ready" in shown, shown
        (old,) = main.children()
        # When its pool process is SIGKILLed
        os.kill(old.pid, signal.SIGKILL)
        killed = time.time()
        total, phases = wait_for(lambda: _ready_lines(w)[1:] or None, 120,
                                 "the replacement's ready line", interval=0.2)[0]
        seen = time.time()
        (new,) = [p for p in main.children() if p.pid != old.pid]
        new_start = started_at(new.pid)
        assert new_start is not None and new_start >= killed - 0.1
        # Then its phases are its own: all within the time from the kill to its line
        assert total <= seen - killed + 0.1, (total, seen - killed, phases)
        assert total < MAIN_AGE_S <= time.time() - main_start, (total, phases)
        assert phases.get("imports", 0.0) < 2.0, phases  # a fork of an imported parent
        assert sum(phases.values()) == pytest.approx(total, abs=0.05 * len(phases)), phases
        # while the first pool process's start still counts from the worker's (imports:
        # the main process's Python, torch and Celery before its fork)
        assert first[1]["imports"] > phases.get("imports", 0.0), (first, phases)
    finally:
        w.stop()
