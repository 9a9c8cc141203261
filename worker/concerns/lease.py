"""One run per job at a time: a lease in Redis (``producer.state.keys.lease``).

When a worker loses its Redis connection, kombu puts the message of the job it is still
running back on the queue and another worker takes it: without a lease the job would run
twice at once. The lease is ``SET NX PX`` with a short lifetime, renewed by a small thread
while the job runs, released with compare-and-delete. Its value names the holder
(``node pid token``): a dead pool process of the same worker (SIGKILL, OOM killer) no longer
holds it, so its requeued job goes on at once. The embedded mode (no Redis) needs none.

The renewal is the run's heartbeat, and the host-loss sweep (``worker.lifecycle.recovery``)
reads it: a host that dies stops renewing, and its lease lapses within ``LEASE_TTL_S``. A lease
that lapsed while its run still lives (a Redis failover longer than the lease, a host stopped
or starved that long) is taken again by the next renewal if nobody else took it meanwhile; if
another run holds it, this run was taken for lost, and the renewal says so in the log.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import redis

from producer.state import keys

log = logging.getLogger(__name__)

LEASE_TTL_S = 10
LEASE_RETRY_S = 5
REDIS_DOWN: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
)
#: How long a run's first Redis calls (the claim, the lease) wait out a lost connection: a
#: Sentinel failover promotes a replica in seconds, and the calls are idempotent.
FAILOVER_S = 30.0

T = TypeVar("T")


def through_failover(call: Callable[[], T], what: str, limit_s: float = FAILOVER_S) -> T:
    """``call()``, again after a lost Redis connection, until ``limit_s`` has passed.

    Only for idempotent calls: a claim or a lease taken on a primary that died before it
    replicated is simply taken again on the promoted replica.
    """
    deadline = time.monotonic() + limit_s
    delay = 0.2
    while True:
        try:
            return call()
        except REDIS_DOWN as e:
            if time.monotonic() + delay > deadline:
                raise
            log.warning("%s: Redis unreachable (%s); again in %.1f s", what, e, delay)
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class JobLease:
    """Held by the one run of a job; ``client`` None (embedded mode) always grants it."""

    def __init__(self, client: Any, job_id: str, node: str) -> None:
        self.r = client
        self.key = keys.lease(job_id)
        self.node = node
        self.token = f"{node} {os.getpid()} {uuid.uuid4().hex}"
        self._stop = threading.Event()
        # Held by a renewal while it runs: once release() has it, no renewal can take the
        # lease again after it was deleted.
        self._renewing = threading.Lock()
        #: The last renewal found the lease held by another run.
        self.lost = False

    def acquire(self) -> bool:
        if self.r is None:
            return True
        if not through_failover(lambda: self._take(LEASE_TTL_S * 1000), f"lease {self.key}"):
            return False
        threading.Thread(target=self._renew, name="job-lease", daemon=True).start()
        return True

    def _take(self, px: int) -> bool:
        if self.r.set(self.key, self.token, nx=True, px=px):
            return True
        holder = self.r.get(self.key)
        if holder is None:
            return bool(self.r.set(self.key, self.token, nx=True, px=px))
        text = holder.decode() if isinstance(holder, bytes) else str(holder)
        if text == self.token:  # ours: the reply of a set that did land was lost
            return True
        node, pid, _ = text.split(" ")
        if node != self.node or _alive(int(pid)):
            return False
        # Compare-and-set: take over the dead process's lease, unless it changed meanwhile.
        return bool(self.r.eval(keys.LEASE_TAKEOVER, 1, self.key, holder, self.token, px))

    def _renew(self) -> None:
        # A thread of its own: loading a large input or a slow first chunk reports nothing.
        while not self._stop.wait(LEASE_TTL_S / 4):
            with self._renewing:
                if self._stop.is_set():
                    return
                try:
                    renewed = self.r.eval(keys.LEASE_RENEW, 1, self.key, self.token,
                                          LEASE_TTL_S * 1000)
                except REDIS_DOWN as e:
                    log.warning("lease %s not renewed: %s", self.key, e)
                    continue
            if renewed == 2:
                log.warning("lease %s had lapsed (Redis away or this host stalled longer than "
                            "%d s); taken again", self.key, LEASE_TTL_S)
            elif not renewed and not self.lost:
                log.error("lease %s is held by another run: this host was taken for lost and "
                          "the job delivered again", self.key)
            self.lost = not renewed

    def release(self) -> None:
        self._stop.set()
        if self.r is None:
            return
        # A renewal under way ends first, so it cannot take the lease again once deleted;
        # one stuck on a Redis that does not answer is not waited for longer than a lease.
        got = self._renewing.acquire(timeout=LEASE_TTL_S)
        try:
            self._delete()
        finally:
            if got:
                self._renewing.release()

    def _delete(self) -> None:
        try:
            self.r.eval(keys.LEASE_RELEASE, 1, self.key, self.token)
        except REDIS_DOWN as e:  # it expires by itself
            log.warning("lease %s not released: %s", self.key, e)
