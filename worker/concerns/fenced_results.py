"""Celery's result store, fenced: a run's states (STARTED, PROGRESS, its end) are stored only
while the run holds its job's lease.

Celery stores a task's states itself (``update_state``, then the return value or the error
after the task function returns). A run that lost its lease (a zombie:
``worker.concerns.fencing``) must not overwrite the state of the run that took the job over,
whenever its write arrives (a partition heals after the other run's SUCCESS). The task's
backend (``DecodeTask.backend``) is the app's Redis backend with one change: a write of the
result key of a task whose run holds a lease in this process goes through
``producer.state.lease_lua.FENCED_RESULT``, which checks the lease and its generation and
stores (SET + PUBLISH, as Celery does) in one atomic step. Any other key, and any other
backend (the embedded mode's database), is Celery's own.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import Celery
from celery.backends.redis import RedisBackend

from producer.state import lease_lua
from worker.concerns.lease import JobLease

log = logging.getLogger(__name__)

#: The lease of each run of this process, by task id (a pool process runs one at a time; the
#: map is for clarity, not concurrency). Held from the lease's take to its release, which
#: comes after Celery stored the run's end (``task_postrun``).
_leases: dict[str, JobLease] = {}
_lock = threading.Lock()


def hold(task_id: str, lease: JobLease) -> None:
    """From now on, ``task_id``'s states are stored only while ``lease`` holds."""
    with _lock:
        _leases[task_id] = lease


def let_go(task_id: str) -> JobLease | None:
    """Forget ``task_id``'s lease (returned, for its release)."""
    with _lock:
        return _leases.pop(task_id, None)


def _lease_of(key: Any, prefix: bytes) -> JobLease | None:
    raw = key if isinstance(key, bytes) else str(key).encode()
    if not raw.startswith(prefix):
        return None
    with _lock:
        return _leases.get(raw[len(prefix):].decode(errors="replace"))


class FencedStore(RedisBackend):  # type: ignore[misc]
    """A Redis result backend whose writes of a leased run's states are fenced."""

    def _set(self, key: Any, value: Any, expires: Any = None) -> None:
        lease = _lease_of(key, self.task_keyprefix)
        if lease is None or not lease.generation:
            super()._set(key, value, expires)
            return
        if lease.lost:  # known already: no round trip (nor Celery's retries of one)
            log.warning("job %s: state not stored: this run lost the job's lease", lease.job)
            return
        if expires is None:
            expires = self.expires
        if not lease.fenced_eval(lease_lua.FENCED_RESULT, (key,), value,
                                 int(expires) if expires else ""):
            log.warning("job %s: state not stored: this run (generation %d on %s) no longer "
                        "holds the job's lease", lease.job, lease.generation, lease.node)


_classes: dict[type, type] = {}


def _fenced_class(base: type) -> type:
    if base not in _classes:
        _classes[base] = type(f"Fenced{base.__name__}", (FencedStore, base), {})
    return _classes[base]


def fenced_backend(app: Celery) -> Any:
    """``app``'s result backend with fenced writes (a Redis or Sentinel one), else its own."""
    base = app.backend
    if not isinstance(base, RedisBackend):
        return base
    return _fenced_class(type(base))(app=app, url=app.conf.result_backend)
