"""A submitted job as the client sees it: its state, progress, result, and a wait with a bar.

``JobHandle`` is cheap to create; every call asks the result backend (one read of state and
payload together) and, when the backend knows nothing, the job registry. ``wait`` rides out a
broker or backend that stops answering for a while (``FRAMEFLEET_WAIT_OUTAGE_S``), keeps
waiting for a job whose records a Redis restart lost (a running job still stores its result),
and says why a queued job waits (``producer.client.hints``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from celery import Celery
from celery.result import AsyncResult

from producer.client.bar import Bar
from producer.client.connection import address, broker_errors
from producer.client.hints import Idle, idle_hint
from producer.client.jobstate import JobState, from_meta
from producer.client.queued import broker_holds
from producer.errors import BrokerUnavailable, JobCancelled, JobFailed, UnknownJobError
from producer.settings import Settings, get_settings
from producer.state.control import Flags, flags_for
from producer.wire.spec import JobResult, Progress, split_key

log = logging.getLogger(__name__)
#: How long ``JobHandle.wait`` lets an id stay unknown before it looks for its message.
UNKNOWN_GRACE_S = 5.0
#: How often ``wait`` looks for the message of a job still unknown after the grace.
LOOK_S = 1.0
#: How often ``wait`` looks again at why a queued job waits (a ping takes up to a second).
HINT_PERIOD_S = 15.0
_Bar = Bar  # the name tests and older callers import


def _io(app: Celery) -> AbstractContextManager[None]:
    """Connection failures inside become one-line ``BrokerError``s naming the URL."""
    conf = app.conf
    return broker_errors(str(conf.broker_url), str(conf.result_backend or conf.broker_url))


def broker_of(app: Celery) -> str:
    """The broker ``app`` asks, for a person: ``host:port``, no password."""
    return address(str(app.conf.broker_url))


def _unknown(job_id: str, app: Celery) -> UnknownJobError:
    return UnknownJobError(f"job {job_id}: no such job on {broker_of(app)} (never submitted, "
                           "or its record expired; FRAMEFLEET_BROKER_URL names the broker)")


class JobHandle:
    """One submitted job. Cheap to create; every call asks the result backend.

    ``key`` is the job's identity (``producer.wire.spec.job_key``: ``tenant:job_id``, a bare
    ``job_id`` for the default tenant); ``tenant`` and ``job_id`` are its parts."""

    def __init__(self, app: Celery, key: str, flags: Flags | None = None,
                 settings: Settings | None = None) -> None:
        self.app = app
        self.key = key
        self.tenant, self.job_id = split_key(key)
        self._flags = flags
        self.settings = settings or get_settings()
        self._known = False  # the registry has the id (it never forgets one while it lives)
        self.reached = False  # Redis answered about this job (a submit did): a blip, not a typo

    def _async(self) -> AsyncResult:
        return AsyncResult(self.key, app=self.app)

    def status(self) -> str:
        """Celery's state: PENDING (unknown or queued alike: ``state()`` tells them apart),
        STARTED, PROGRESS, RETRY, SUCCESS, FAILURE or REVOKED."""
        with _io(self.app):
            return str(self._async().state)

    def _meta(self) -> tuple[str, Any]:
        # One read of state and payload together: two reads could straddle a state change.
        with _io(self.app):
            meta = self.app.backend.get_task_meta(self.key)
        return str(meta.get("status", "PENDING")), meta.get("result")

    def registered(self) -> bool:
        """Whether this job_id was ever submitted (its claim is in the job registry)."""
        if not self._known:
            with _io(self.app):
                flags = self._flags or flags_for(self.app)
                self._known = flags.registered(self.key) is not None
        return self._known

    def state(self) -> JobState:
        """The job's state, UNKNOWN and QUEUED told apart, with progress, worker or reason."""
        status, info = self._meta()
        return from_meta(self.key, status, info, status == "PENDING" and self.registered())

    def in_broker(self) -> bool:
        """Whether the broker holds this job's message, queued or held by a worker that has
        not started it yet (``producer.client.queued``)."""
        with _io(self.app):
            return broker_holds(self.app, self.key)

    def idle(self) -> Idle | None:
        """Why this job waits, if it is queued while no worker took a job for a while
        (``producer.client.hints``); None when nothing is amiss."""
        with _io(self.app):
            return idle_hint(self.app, self._flags or flags_for(self.app, self.settings),
                             self.key, self.settings)

    def progress(self) -> Progress | None:
        state, info = self._meta()
        if state == "PROGRESS" and isinstance(info, dict):
            return Progress.model_validate(info)
        return None

    def result(self) -> JobResult:
        """The result of a finished job; raises JobFailed/JobCancelled otherwise."""
        with _io(self.app):
            return self._result()

    def _result(self) -> JobResult:
        ar = self._async()
        state = ar.state
        if state == "SUCCESS":
            return JobResult.model_validate(ar.result)
        if state == "REVOKED":
            raise JobCancelled(f"job {self.key} was cancelled")
        if state == "FAILURE":
            exc = ar.result
            raise JobFailed(self.key, type(exc).__name__, str(exc))
        raise TimeoutError(f"job {self.key} is not finished (state {state})")

    def wait(
        self, timeout: float | None = None, progress: bool = False, poll_s: float = 0.05,
        unknown_grace_s: float = UNKNOWN_GRACE_S, outage_s: float | None = None,
        say: Callable[[str], None] | None = None,
    ) -> JobResult:
        """Block until the job finishes; with ``progress`` draw a rich progress bar that shows
        the state (queued, started, retrying and why, the stage and the worker).

        Raises ``UnknownJobError`` when the id is still unknown (never submitted) after
        ``unknown_grace_s`` and its message is not in the broker either, twice in a row: a job
        sent around the client, straight to the queue, is known to the registry only once a
        worker starts it, and waits in the queue (or in a worker still starting) until then.
        JobFailed / JobCancelled as ``result()``; TimeoutError after
        ``timeout`` s (None: no limit). A broker or backend that stops answering once it has
        answered is waited for up to ``outage_s`` (default ``FRAMEFLEET_WAIT_OUTAGE_S``) before
        ``BrokerUnavailable`` is raised; one that never answered raises it at once. ``say``
        gets the lines worth a person's attention (the outage and its end, records lost, why
        a queued job waits); default: this module's log, or above the bar.
        """
        bar = _LazyBar(self.key)
        watch = _Watch(self, outage_s, say or (bar.say if progress else log.warning))
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        try:
            while True:
                js = watch.state()
                if js is not None and js.state == "UNKNOWN" and not watch.seen and (
                        time.monotonic() - start >= unknown_grace_s) and watch.nowhere():
                    raise _unknown(self.key, self.app)
                if js is not None and js.finished:
                    result = watch.result()
                    if result is not None:
                        if bar.bar is not None:
                            bar.bar.finished(result)
                        return result
                if js is not None and progress:
                    bar.get().show(js)
                if deadline is not None and time.monotonic() > deadline:
                    state = js.state if js is not None else "unreachable"
                    raise TimeoutError(f"job {self.key} still {state} after {timeout:g} s "
                                       f"(broker {broker_of(self.app)})")
                time.sleep(watch.pause(poll_s))
        finally:
            bar.close()


class _LazyBar:
    """``wait``'s bar, drawn only once the job is seen unfinished (or there is something to
    say): a job that had already ended gets its end at once, not a bar at "submitted"."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.bar: Bar | None = None

    def get(self) -> Bar:
        if self.bar is None:
            self.bar = _Bar(self.key)
        return self.bar

    def say(self, line: str) -> None:
        self.get().say(line)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class _Watch:
    """What ``wait`` keeps between two looks: an outage in progress, whether the job was seen,
    when it last looked at why a queued job waits."""

    def __init__(self, handle: JobHandle, outage_s: float | None,
                 say: Callable[[str], None]) -> None:
        self.handle, self.say = handle, say
        self.outage_s = handle.settings.wait_outage_s if outage_s is None else outage_s
        self.down_since: float | None = None
        self.failures = 0
        self.reached = handle.reached  # one answer seen: only then is no answer an outage
        self.seen = False  # known to Redis once: UNKNOWN later is not "never submitted"
        self.ran = False  # seen on a worker: QUEUED or UNKNOWN later means records lost
        self.said_lost = False
        self.next_hint = 0.0
        self.hint: tuple[str, ...] | None = None
        self.next_look = 0.0
        self.misses = 0  # looks in a row that found the unknown job's message nowhere

    def _call(self, read: Callable[[], Any]) -> Any:
        """``read()``, or None while the broker or backend is unreachable (within budget)."""
        try:
            value = read()
        except BrokerUnavailable as e:
            if not self.reached:  # never reached: a wrong URL, not a blip; say so at once
                raise
            now = time.monotonic()
            if self.down_since is None:
                self.down_since = now
                if self.outage_s > 0:
                    self.say(f"{e}; waiting up to {self.outage_s:g} s for it to come back "
                             "(FRAMEFLEET_WAIT_OUTAGE_S); the job itself goes on")
            self.failures += 1
            down = now - self.down_since
            if down >= self.outage_s:
                raise BrokerUnavailable(f"{e} (no answer for {down:.0f} s; "
                                        f"FRAMEFLEET_WAIT_OUTAGE_S={self.outage_s:g})") from e
            return None
        self.reached = True
        if self.down_since is not None:
            self.say(f"job {self.handle.key}: reachable again after "
                     f"{time.monotonic() - self.down_since:.1f} s")
            self.down_since, self.failures = None, 0
        return value

    def state(self) -> JobState | None:
        js: JobState | None = self._call(self.handle.state)
        if js is None:
            return None
        if js.state != "UNKNOWN":
            self.seen = True
        if js.state in ("STARTED", "PROGRESS", "RETRY", "REQUEUED"):
            self.ran = True
        elif js.state in ("QUEUED", "UNKNOWN") and self.ran:
            self._lost()
        elif js.state == "QUEUED":
            self._hint()
        return js

    def result(self) -> JobResult | None:
        result: JobResult | None = self._call(self.handle.result)
        return result

    def nowhere(self) -> bool:
        """An unknown job's message is in the broker neither now nor at the last look (a
        message is moved from the queue to a worker's hold: one look can fall between)."""
        now = time.monotonic()
        if now < self.next_look:
            return False
        self.next_look = now + LOOK_S
        held = self._call(self.handle.in_broker)
        if held is None:  # unreachable: the outage budget decides
            return False
        self.misses = 0 if held else self.misses + 1
        return self.misses >= 2

    def _lost(self) -> None:
        """A job seen running reads queued or unknown again: Redis lost its records (a
        restart without persistence). Said once; a running job still stores its result."""
        if not self.said_lost:
            self.said_lost = True
            self.say(f"job {self.handle.key}: Redis lost its records (restarted without "
                     "persistence?); its worker still stores the result, which this waits for")

    def _hint(self) -> None:
        """Every ``HINT_PERIOD_S`` while queued: why it waits, said when the verdict (no
        worker alive, or how many) changes."""
        now = time.monotonic()
        if now < self.next_hint:
            return
        h = self.handle
        idle = self._call(h.idle)
        # Not idle yet: look again soon (two Redis reads); idle: a ping each time, so rarely.
        self.next_hint = now + (HINT_PERIOD_S if idle is not None
                                else min(HINT_PERIOD_S, h.settings.idle_hint_s / 2))
        verdict = None if idle is None else idle.workers
        if idle is not None and verdict != self.hint:
            self.say(f"job {h.key} is queued: {idle.text()}")
        self.hint = verdict

    def pause(self, poll_s: float) -> float:
        """Seconds to the next look: ``poll_s``, longer while the broker is away."""
        return poll_s if self.failures == 0 else min(2.0, 0.25 * 2 ** min(self.failures, 3))
