"""The one owner of a worker process's device: jobs first, builds only while no job runs.

Two kinds of device work happen in a worker process:

- a **job** (a run, the warm-up): the job thread holds the device for its whole length,
  ``with DEVICE.job("run"):``;
- a **build**: work that only makes later jobs faster (a decode size's graph: compile, warm,
  capture). It is queued with ``DEVICE.submit(name, fn)`` and runs on the owner's one builder
  thread, one build at a time, only while no job holds or waits for the device, and only once
  the device has been idle for ``idle_s`` (``FRAMEFLEET_BUILD_IDLE_S``): a queue that hands the
  worker its next job at once keeps the worker on jobs, and the builds run when it drains.

The rule, which makes the design deadlock-free by construction: at any moment at most one thread
works on the device, and it is either the job thread or the builder. A job that arrives during a
build waits for that one build to end (never for a queued one: a waiting job goes first), and
every queued build waits until no job holds or waits for the device. A size a job meets with no
graph yet decodes eagerly; its build runs after the job.

There is one lock (the owner's condition). It is held only inside this module's methods, for
bookkeeping, and released before a job's body or a build's function runs; no caller holds a lock
of its own while it waits here. So no thread ever holds two locks, and no order of taking them
can cycle. A build never waits for a job to end from inside itself (``job`` on the builder
thread raises): a build that did would wait for itself.

A build that raises is logged and dropped: a graph is an optimisation, and the eager path stays
correct. ``close`` (the pool process's shutdown) drops queued builds, lets a running one end and
joins the builder, so no thread is left running at exit. A job that waits for a build tells
the stuck-job watchdog (stage ``wait_device``): a build that hangs is reported like any stuck job.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from worker.watchdog import WATCHDOG

log = logging.getLogger(__name__)


@dataclass
class OwnerStats:
    """What the owner did, for the ready line, the metrics and the tests."""

    builds_done: int = 0
    builds_failed: int = 0
    #: Jobs that found a build running and waited for it, and the seconds they waited.
    job_waits: int = 0
    job_waited_s: float = 0.0


class DeviceOwner:
    """Hands the device to one job or one build at a time; jobs go first."""

    def __init__(self, idle_s: float = 0.0) -> None:
        """``idle_s``: seconds without a job before a build may start."""
        self.idle_s = idle_s
        self._last_job_end = float("-inf")  # monotonic
        self._cond = threading.Condition()
        self._holder: int | None = None  # the thread ident of the job holding the device
        self._depth = 0  # ``job`` nests on its holder's thread
        self._what = ""  # what the holder said it does
        self._jobs_waiting = 0
        self._building: str | None = None  # the name of the build running now
        self._queue: deque[tuple[str, Callable[[], object]]] = deque()
        self._names: set[str] = set()  # queued or running builds, by name (each once)
        self._builder: threading.Thread | None = None
        self._closed = False
        self.stats = OwnerStats()

    @contextmanager
    def job(self, what: str = "job") -> Iterator[None]:
        """Hold the device for the block: waits for a running build to end; no build starts
        until the block has ended. Nests on the same thread."""
        me = threading.get_ident()
        with self._cond:
            if self._builder is not None and me == self._builder.ident:
                raise RuntimeError("a build may not wait for a job: it would wait for itself")
            nested = self._holder == me
            if nested:
                self._depth += 1
            busy = not nested and self._building is not None
        if busy:  # a build that never ends leaves this job stuck here, by name (outside the
            WATCHDOG.note("wait_device")  # lock: this thread never holds two)
        if not nested:
            with self._cond:
                t0 = time.monotonic()
                waited = self._building is not None
                self._jobs_waiting += 1
                try:
                    while self._holder is not None or self._building is not None:
                        self._cond.wait()
                finally:
                    self._jobs_waiting -= 1
                self._holder, self._depth, self._what = me, 1, what
                if waited:
                    self.stats.job_waits += 1
                    self.stats.job_waited_s += time.monotonic() - t0
        try:
            yield
        finally:
            with self._cond:
                self._depth -= 1
                if not self._depth:
                    self._holder, self._what = None, ""
                    self._last_job_end = time.monotonic()
                    self._cond.notify_all()

    def holds(self) -> bool:
        """Whether the calling thread may use the device now (it holds a job, or it is the
        builder running a build)."""
        me = threading.get_ident()
        with self._cond:
            return self._holder == me or (
                self._building is not None and self._builder is not None
                and self._builder.ident == me)

    def submit(self, name: str, fn: Callable[[], object]) -> bool:
        """Queue ``fn`` as the build ``name``: it runs on the builder thread once no job holds
        or waits for the device. False if a build of that name is queued or running already,
        or the owner is closed."""
        with self._cond:
            if self._closed or name in self._names:
                return False
            self._names.add(name)
            self._queue.append((name, fn))
            if self._builder is None or not self._builder.is_alive():
                # Started here, never at import: a thread does not survive the pool's fork.
                self._builder = threading.Thread(target=self._loop, name="device-builds",
                                                 daemon=True)
                self._builder.start()
            self._cond.notify_all()
            return True

    def _build_in(self) -> float | None:
        """Seconds until the next build may start (0: now); None: not before a change."""
        if not self._queue or self._holder is not None or self._jobs_waiting:
            return None
        return max(0.0, self._last_job_end + self.idle_s - time.monotonic())

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (wait := self._build_in()) != 0:
                    self._cond.wait(wait)
                if self._closed:
                    return
                name, fn = self._queue.popleft()
                self._building = name
            ok = False
            try:
                fn()
                ok = True
            except Exception:  # an optimisation failed: the eager path stays correct
                log.exception("build %s failed; what it would speed up stays eager", name)
            finally:
                with self._cond:
                    self._building = None
                    self._names.discard(name)
                    if ok:
                        self.stats.builds_done += 1
                    else:
                        self.stats.builds_failed += 1
                    self._cond.notify_all()

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until no build is queued or running (tests, benchmarks, a warm-up that wants
        its background builds done). True if drained. The caller must not hold the device:
        no build could run meanwhile."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            if self._holder == threading.get_ident():
                raise RuntimeError("drain() inside job(): the builds wait for this job to end")
            while self._queue or self._building is not None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def describe(self) -> str:
        """Who has the device now, in words (the stuck-job report, the logs)."""
        with self._cond:
            if self._building is not None:
                held = f"build {self._building}"
            elif self._holder is not None:
                held = self._what or "job"
            else:
                held = "nobody"
            return (f"device held by {held}; {self._jobs_waiting} job(s) waiting, "
                    f"{len(self._queue)} build(s) queued")

    def close(self, timeout: float = 30.0) -> bool:
        """Drop queued builds, let a running one end, join the builder (the process's
        shutdown). True if no builder thread is left running."""
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._names = {self._building} if self._building else set()
            self._cond.notify_all()
            builder = self._builder
        if builder is None or builder.ident == threading.get_ident():
            return True
        builder.join(timeout)
        if builder.is_alive():
            log.warning("a build still runs %.0f s after the shutdown began: %s", timeout,
                        self.describe())
            return False
        return True

    def _after_fork(self) -> None:
        """A forked child starts with a fresh owner: the parent's builder thread and lock
        state do not exist there."""
        self.__init__(self.idle_s)  # type: ignore[misc]


#: The process's owner: every job and every build of this process goes through it.
DEVICE = DeviceOwner()
os.register_at_fork(after_in_child=DEVICE._after_fork)
