"""A pool process's start, bounded and watched from the worker's main process.

Celery's prefork pool replaces a pool process that dies, and kills one that has not said it is
up within ``worker_proc_alive_timeout`` (4 s by default). A framefleet pool process says so
only after its start: imports, then the warm-up model and decoder (``worker.lifecycle.main``'s
``worker_process_init``), which takes seconds on the CPU and minutes on a GPU with a cold
compile cache. With Celery's default every replacement of a lost pool process was killed
after 4 s, for ever, and the worker held its GPU doing nothing.

- ``start_timeout`` is the time a start may really need (``FRAMEFLEET_POOL_START_TIMEOUT_S``);
  ``worker.lifecycle.main`` gives it to Celery as ``worker_proc_alive_timeout``.
- ``PoolWatch``, a thread of the main process, kills a pool process not up within that time
  (Celery itself times out only the replacements of lost pool processes, not the first
  ones), and counts pool processes that ended before they were up (crashed, killed by the
  OOM killer or for their time). After
  ``FRAMEFLEET_POOL_START_FAILURES`` in a row it logs one error and stops the worker with
  ``POOL_START_EXIT``: a child that can never start is the supervisor's business (the launcher,
  systemd, Kubernetes restart the worker with back-off), not a loop inside Celery.

"Up" is read from the pool process's own readiness file (``producer.state.readiness``: written
ready at the end of its warm-up, right before Celery's up message). The pool's process list is
Celery's (``AsynPool._pool``), read, never changed.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from producer.settings import Settings
from producer.state.readiness import process_start_time, state_dir

log = logging.getLogger(__name__)

#: sysexits' EX_TEMPFAIL: the worker stopped because its pool process cannot start; a
#: supervisor restarts it (the launcher does, with back-off).
POOL_START_EXIT = 75
#: Seconds a start may take with nothing to warm up, and with a warm-up model or decoder.
BARE_START_S = 120.0
WARM_START_S = 1800.0


def start_timeout(settings: Settings) -> float:
    """Seconds a pool process may take to start before Celery kills it as hung."""
    if settings.pool_start_timeout_s is not None:
        return settings.pool_start_timeout_s
    warms = settings.warmup_model is not None or settings.warmup_decoder is not None
    return WARM_START_S if warms else BARE_START_S


@dataclass
class _Child:
    pid: int
    born: float
    start: str | None  # its start time, read while it lived: its readiness file's "start"
    up: bool = False
    killed: bool = False


def _is_up(folder: Path, child: _Child) -> bool:
    """Whether pool process ``child`` wrote itself ready (its readiness file)."""
    try:
        state = json.loads((folder / f"{child.pid}.json").read_text())
    except (OSError, ValueError):
        return False
    return (bool(state.get("ready")) and child.start is not None
            and state.get("start") == child.start)


class PoolWatch(threading.Thread):
    """Counts pool processes that end before they are up; stops the worker after too many."""

    def __init__(self, pool: Any, settings: Settings, poll_s: float = 0.5) -> None:
        """``pool``: Celery's ``AsynPool`` (``consumer.pool._pool``)."""
        super().__init__(name="framefleet-pool-watch", daemon=True)
        self.pool = pool
        self.limit = settings.pool_start_failures
        self.timeout_s = start_timeout(settings)
        self.folder = state_dir(settings)
        self.poll_s = poll_s
        self.failures = 0
        self.stopped = threading.Event()
        self._children: dict[int, _Child] = {}

    def run(self) -> None:
        while not self.stopped.wait(self.poll_s):
            try:
                if self.poll():
                    return
            except Exception:
                log.exception("pool watch: poll failed")

    def poll(self) -> bool:
        """One look at the pool; True once the worker was told to stop."""
        procs = list(getattr(self.pool, "_pool", ()))
        # A dead process stays in Celery's list until it is reaped: alive means no exit code.
        alive = {p.pid for p in procs if p.pid and p.exitcode is None}
        codes = {p.pid: p.exitcode for p in procs if p.pid and p.exitcode is not None}
        now = time.monotonic()
        for pid in alive - set(self._children):
            self._children[pid] = _Child(pid, now, process_start_time(pid))
        for pid in alive:
            child = self._children[pid]
            if not child.up and _is_up(self.folder, child):
                child.up = True
                self.failures = 0
            elif not child.up and not child.killed and now - child.born > self.timeout_s:
                # Celery times out only the replacements of lost processes, never the
                # first ones: a hung first start would hold the GPU for ever.
                log.warning("pool process %d not up after %.0f s: killing it", pid,
                            now - child.born)
                child.killed = True
                _kill(pid)
        for pid in [pid for pid in self._children if pid not in alive]:
            child = self._children.pop(pid)
            if not child.up and _is_up(self.folder, child):
                # Up since the last look, then ended (stopped with the worker, say): a start
                # that succeeded, not one that failed.
                child.up = True
                self.failures = 0
            if child.up:
                continue
            self.failures += 1
            log.warning("pool process %d ended before it was up (%s, after %.1f s); "
                        "%d of %d starts in a row failed", pid, _how(codes.get(pid)),
                        now - child.born, self.failures, self.limit)
            if self.failures >= self.limit:
                self._stop_worker()
                return True
        return False

    def _stop_worker(self) -> None:
        log.error(
            "pool process could not start %d times in a row (each was given %.0f s, "
            "FRAMEFLEET_POOL_START_TIMEOUT_S): stopping this worker with exit status %d so "
            "that its supervisor restarts it; the cause is in the lines above",
            self.failures, self.timeout_s, POOL_START_EXIT)
        from celery.worker import state

        state.should_stop = POOL_START_EXIT  # the main loop's next turn: a warm shutdown
        self.stopped.set()


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _how(exitcode: int | None) -> str:
    if exitcode is None:
        return "exit status unknown"
    if exitcode < 0:
        return f"killed by signal {-exitcode}"
    return f"exit status {exitcode}"
