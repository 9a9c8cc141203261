"""The pool watch's count of failed starts, against real child processes standing in for
Celery's pool processes (the whole worker is in test_pool_start.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from celery.worker import state as celery_state

from producer.settings import Settings
from producer.state.readiness import WarmupState, process_start_time, write_state
from worker.lifecycle.poolwatch import POOL_START_EXIT, PoolWatch


@dataclass
class _Proc:
    """What the watch reads of a process of Celery's pool list."""

    pid: int
    exitcode: int | None = None


class _Pool:
    def __init__(self) -> None:
        self._pool: list[_Proc] = []


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _watch(tmp_path: Path, pool: _Pool) -> PoolWatch:
    return PoolWatch(pool, Settings(work_dir=str(tmp_path), pool_start_failures=2))


def _end(proc: subprocess.Popen[bytes], entry: _Proc) -> None:
    """SIGTERM, as a stop of the worker's process group sends it; reaped as Celery does."""
    proc.send_signal(signal.SIGTERM)
    entry.exitcode = proc.wait(timeout=10)


def test_a_process_up_between_two_looks_that_then_ends_is_no_failed_start(
        tmp_path: Path, child: subprocess.Popen[bytes]) -> None:
    pool = _Pool()
    entry = _Proc(child.pid)
    pool._pool.append(entry)
    watch = _watch(tmp_path, pool)
    assert watch.poll() is False  # seen starting
    # Given it writes itself ready and is stopped before the watch looks again
    start = process_start_time(child.pid)
    assert start
    write_state(watch.folder, WarmupState(pid=child.pid, start=start, ready=True))
    _end(child, entry)
    # Then it ended up, not before it was up
    assert watch.poll() is False
    assert watch.failures == 0


def test_a_process_that_ends_before_it_is_up_still_counts(
        tmp_path: Path, child: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(celery_state, "should_stop", None)  # the watch sets it: put it back
    pool = _Pool()
    watch = _watch(tmp_path, pool)
    second = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # Given one ends still warming up, the next with a ready file of an older process
        # that had its pid
        for proc, start in ((child, process_start_time(child.pid)), (second, "1")):
            entry = _Proc(proc.pid)
            pool._pool.append(entry)
            assert watch.poll() is False
            assert start
            write_state(watch.folder, WarmupState(pid=proc.pid, start=start,
                                                  ready=proc is second))
            _end(proc, entry)
            stopped = watch.poll()
        # Then both count, and two in a row stop the worker
        assert stopped is True and watch.failures == 2
        assert celery_state.should_stop == POOL_START_EXIT
    finally:
        second.kill()
        second.wait(timeout=10)
