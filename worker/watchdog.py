"""The stuck-job watchdog of a pool process: a job whose progress stops ends its process.

A run reports progress as it goes (a denoise step, a decoded chunk, a segment stored). A hang
(a deadlock between two threads, a device call that never returns, a store that never
answers) reports nothing more, and without a watchdog it holds a billed GPU until the job's
time limit, hours later, saying nothing. So each pool process has one ``Watchdog`` thread:

- ``arm(job, limit_s, on_stuck)`` when a run starts (stage ``start``), ``disarm(token)`` when
  it ends; ``beat(stage)`` for each unit of progress (it resets the clock), ``note(stage)``
  to name what the run waits for now without resetting it (``wait_device``: a job that
  never gets its device is stuck there);
- once ``limit_s`` passes without a beat, the thread logs the job and the stage, dumps every
  thread's stack (``faulthandler``) into the stream the worker logs to, calls ``on_stuck(stage,
  idle_s)`` (the task's concern records the stage in the job's run record, bounded in time)
  and ends the process with ``STUCK_EXIT``. Celery replaces the process and, with
  ``acks_late`` + ``reject_on_worker_lost``, delivers the job again; the poison cap
  (``worker.concerns.losses``) fails it there, naming the stage.

A hang that holds the GIL (a C extension spinning in native code) stops that thread too. So
a pool process also arms a backstop that needs no GIL: ``faulthandler``'s own timer thread
(``backstop``, set when the pool process starts), at twice the limit plus
:data:`BACKSTOP_SLACK_S`, re-armed as beats come (at most four times a limit). When the
Python watchdog can run it always fires first; when it cannot, the timer dumps every thread's
stack (headed ``Timeout``) and ends the process with status 1: Celery delivers the job again
as above, without the stage in the run record (the stacks name it).

One thread, one lock, a stop flag; the thread never calls out while holding the lock.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

log = logging.getLogger(__name__)

#: The exit status of a pool process ended by the watchdog (sysexits' EX_SOFTWARE, as a
#: process retired after a CUDA error: ``worker.concerns.device``).
STUCK_EXIT = 70
#: The stage of a run that reported nothing yet.
START = "start"
#: Stages the metric's label may take; any other is counted as ``other`` (bounded labels).
STAGES = ("start", "wait_device", "load", "denoise", "decode", "upload")
#: Seconds ``on_stuck`` may take (it writes to Redis) before the process ends regardless.
RECORD_TIMEOUT_S = 10.0

#: Seconds the backstop waits beyond twice the limit: the Python watchdog's record and dump
#: come first.
BACKSTOP_SLACK_S = RECORD_TIMEOUT_S + 5.0

#: ``on_stuck(stage, idle_s)``: record the stuck run before its process ends.
OnStuck = Callable[[str, float], None]


def stage_label(stage: str) -> str:
    """``stage`` as a metric label: one of ``STAGES``, else ``other``."""
    return stage if stage in STAGES else "other"


@dataclass
class _Armed:
    job: str
    limit_s: float
    on_stuck: OnStuck
    stage: str
    last: float  # monotonic time of the last beat (or of the arming)


class Watchdog:
    """Ends the process when the armed run's progress stops for its limit (module docstring).

    ``clock``, ``exit`` and ``stream`` (where the stacks go) are the tests' seams: the real
    ones are ``time.monotonic``, ``os._exit`` and the stream the worker logs to."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 exit: Callable[[int], Any] = os._exit, stream: IO[str] | None = None) -> None:
        self._clock, self._exit, self._stream = clock, exit, stream
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._armed: _Armed | None = None
        self._limit_s = 10.0
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        #: Arm faulthandler's timer too (a pool process; module docstring). Off by default:
        #: it is process-wide and ends the process, no place for a test's fake clock.
        self.backstop = False
        self.backstop_slack_s = BACKSTOP_SLACK_S
        self._rearmed = 0.0  # monotonic time the backstop was last armed

    def arm(self, job: str, limit_s: float, on_stuck: OnStuck) -> object:
        """Watch ``job`` from now; returns the token that ``disarm`` takes. ``limit_s`` 0: off."""
        armed = _Armed(job, limit_s, on_stuck, START, self._clock())
        with self._lock:
            self._armed = armed if limit_s > 0 else None
            self._limit_s = limit_s if limit_s > 0 else self._limit_s
            if limit_s > 0 and (self._thread is None or self._pid != os.getpid()):
                # A forked child inherits the object, not its thread: start its own.
                self._pid, self._stop = os.getpid(), threading.Event()
                self._thread = threading.Thread(target=self._loop, name="framefleet-watchdog",
                                                daemon=True)
                self._thread.start()
            self._arm_backstop(armed if limit_s > 0 else None)
        return armed

    def beat(self, stage: str | None = None) -> None:
        """The armed run made progress in ``stage`` (None: in the stage it is in)."""
        with self._lock:
            if self._armed is not None:
                self._armed.last = self._clock()
                if stage is not None:
                    self._armed.stage = stage
                if self.backstop and time.monotonic() - self._rearmed >= self._armed.limit_s / 4:
                    self._arm_backstop(self._armed)

    def note(self, stage: str) -> None:
        """The armed run is in ``stage`` now (no progress: the clock runs on)."""
        with self._lock:
            if self._armed is not None:
                self._armed.stage = stage

    def disarm(self, token: object) -> None:
        """Stop watching the run that ``arm`` returned ``token`` for (another's: nothing)."""
        with self._lock:
            if self._armed is token:
                self._armed = None
                self._arm_backstop(None)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread and wait for it (the process's clean exit)."""
        with self._lock:
            self._armed = None
            self._arm_backstop(None)
            thread, self._thread = self._thread, None
        self._stop.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _arm_backstop(self, armed: _Armed | None) -> None:
        """(Re)start faulthandler's timer for ``armed`` (None: cancel it). Under the lock:
        faulthandler takes none of ours."""
        if not self.backstop:
            return
        if armed is None:
            faulthandler.cancel_dump_traceback_later()
            return
        self._rearmed = time.monotonic()
        faulthandler.dump_traceback_later(2 * armed.limit_s + self.backstop_slack_s,
                                          exit=True, file=log_stream())

    def _loop(self) -> None:
        stop = self._stop
        while not stop.wait(self._period()):
            with self._lock:
                armed = self._armed
                idle = 0.0 if armed is None else self._clock() - armed.last
                stuck = armed is not None and idle >= armed.limit_s
                stage = armed.stage if armed is not None else START
            if stuck and armed is not None:
                self._fire(armed, stage, idle)
                return

    def _period(self) -> float:
        with self._lock:  # the last limit armed, armed or not (the next run's is the same)
            return max(0.01, min(self._limit_s / 10, 5.0))  # late by a tenth at most

    def _fire(self, armed: _Armed, stage: str, idle: float) -> None:
        log.critical("job %s: stuck in %s: no progress for %.0f s (FRAMEFLEET_STUCK_S=%g); "
                     "every thread's stack follows; retiring pool process %d, the job goes "
                     "back to the queue", armed.job, stage, idle, armed.limit_s, os.getpid())
        try:
            dump_stacks(self._stream)
        except Exception:  # a stream without a descriptor: the exit must still come
            log.exception("job %s: the stacks were not dumped", armed.job)
        recorder = threading.Thread(target=self._record, args=(armed, stage, idle),
                                    name="framefleet-watchdog-record", daemon=True)
        recorder.start()
        recorder.join(RECORD_TIMEOUT_S)  # a Redis that does not answer keeps no GPU idle
        _flush_logs()
        self._exit(STUCK_EXIT)

    @staticmethod
    def _record(armed: _Armed, stage: str, idle: float) -> None:
        try:
            armed.on_stuck(stage, idle)
        except Exception:  # the process ends all the same; the next run counts a loss
            log.exception("job %s: the stuck run was not recorded", armed.job)


def dump_stacks(stream: IO[str] | None = None) -> None:
    """Every thread's Python stack into ``stream`` (default: the one the worker logs to)."""
    out = stream or log_stream()
    out.flush()
    faulthandler.dump_traceback(file=out, all_threads=True)
    out.flush()


def log_stream() -> IO[str]:
    """The stream the root logger's first stream handler writes to, if it is a real file (a
    log file, the worker's stderr); else the process's original stderr."""
    for handler in logging.getLogger().handlers:
        stream = getattr(handler, "stream", None)
        try:
            if stream is not None and stream.fileno() >= 0:
                return stream  # type: ignore[no-any-return]
        except (AttributeError, OSError, ValueError):  # no descriptor (a logging proxy)
            continue
    return sys.__stderr__ or sys.stderr


def _flush_logs() -> None:
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:  # noqa: BLE001 - the process ends next; nothing to do about it
            pass


#: The pool process's watchdog.
WATCHDOG = Watchdog()
