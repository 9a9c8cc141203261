"""Why a queued job waits: when a worker last took a job, and how many workers are alive.

A job that stays QUEUED while no worker takes anything is the commonest first-hour trouble (no
worker started, or one on another broker). ``idle_hint`` says so once the job has waited
``FRAMEFLEET_IDLE_HINT_S`` and no worker has taken a job for as long: it reads the stamp every
worker leaves when it receives a job (``producer.state.control.Flags.last_taken``) and asks the
fleet for a ping (Celery's broadcast, answered by live workers within a second). Nothing is
asked before the job has waited that long, so a healthy fleet pays nothing for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from celery import Celery

from producer.settings import Settings
from producer.state.control import Flags, RedisFlags

#: How long a ping waits for answers.
PING_TIMEOUT_S = 1.0


def duration(seconds: float) -> str:
    """``45 s``, ``3m05s``, ``2h03m``."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


@dataclass(frozen=True)
class Idle:
    """A queued job and a fleet that took nothing for a while."""

    waited_s: float | None
    taken_ago_s: float | None
    workers: tuple[str, ...]

    def text(self) -> str:
        """One line: what happened, and what to do about it."""
        taken = ("no worker has taken a job since Redis kept count" if self.taken_ago_s is None
                 else f"no worker has taken a job for {duration(self.taken_ago_s)}")
        waited = "" if self.waited_s is None else f" (this one waits {duration(self.waited_s)})"
        if not self.workers:
            alive = ("; no worker answers a ping: start one (framefleet worker) where "
                     "FRAMEFLEET_BROKER_URL is this broker")
        else:
            names = ", ".join(self.workers[:3]) + (", ..." if len(self.workers) > 3 else "")
            alive = (f"; {len(self.workers)} worker(s) answer a ping ({names}): busy with long "
                     "jobs, or consuming another queue?")
        return taken + waited + alive


def ping_workers(app: Celery, timeout: float = PING_TIMEOUT_S) -> tuple[str, ...]:
    """The node names of the workers that answer a ping within ``timeout``."""
    replies = app.control.ping(timeout=timeout) or []
    return tuple(sorted(name for reply in replies for name in reply))


def idle_hint(app: Celery, flags: Flags, key: str, settings: Settings,
              ping: Callable[[Celery], tuple[str, ...]] = ping_workers,
              now: float | None = None) -> Idle | None:
    """An ``Idle`` when the queued job ``key`` has waited ``idle_hint_s`` while no worker took a
    job for as long; None otherwise, and in the embedded mode (its demo starts its worker)."""
    if not isinstance(flags, RedisFlags):
        return None
    now = time.time() if now is None else now
    sent, taken = flags.sent_at(key), flags.last_taken()
    waited = None if sent is None else now - sent
    taken_ago = None if taken is None else now - taken
    limit = settings.idle_hint_s
    if (waited is not None and waited < limit) or (taken_ago is not None and taken_ago < limit):
        return None
    return Idle(waited, taken_ago, ping(app))
