"""One run per job at a time: a lease in Redis (``producer.state.keys.lease``), and its
generation, the fencing token every shared write of the run checks.

When a worker loses its Redis connection, kombu puts the message of the job it is still
running back on the queue and another worker takes it: without a lease the job would run
twice at once. The lease is ``SET NX PX`` with a short lifetime, renewed by a small thread
while the job runs, released with compare-and-delete. Its value names the holder
(``node pid token``): a dead pool process of the same worker (SIGKILL, OOM killer) no longer
holds it, so its requeued job goes on at once. The embedded mode (no Redis) needs none.

The renewal is the run's heartbeat, and the host-loss sweep (``worker.lifecycle.recovery``)
reads it: a host that dies stops renewing, and its lease lapses within ``LEASE_TTL_S``.

**Fencing.** A run whose host was only cut off (a partition, a stall longer than the lease)
lives on while the job runs again elsewhere: a zombie. Every take of the lease bumps the job's
generation (``keys.lease_generation``), and the run is a :class:`~worker.stores.fence.Fence`:

- its writes to the store land only while the lease is known to be held
  (``check``: the last renewal answered within ``LEASE_TTL_S - WRITE_MARGIN_S``; see
  ``worker.stores.fence`` for why no write can land later), and wait while it is not known;
- its writes in Redis (the end's marks, Celery's result and progress) check the lease and
  the generation in the same Lua script (``producer.state.lease_lua``);
- a renewal that finds the lease held by another run, a newer generation, or the job ended
  marks the run ``lost`` for good: every later check raises ``LeaseLost`` and the run stops
  at its next chunk or step, storing nothing (``worker.concerns.fencing``). A lease that
  lapsed while nobody took it (a Redis failover longer than the lease) is taken again by the
  next renewal, and the writes that waited go on.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import redis

from producer.errors import LeaseLost
from producer.state import keys, lease_lua
from worker.stores.fence import WRITE_MARGIN_S

log = logging.getLogger(__name__)

LEASE_TTL_S = 10
#: A renewal every 2 s: the lease is then known held for at least 8 s minus a round trip,
#: more than the ``WRITE_MARGIN_S`` (7 s) a write needs.
RENEW_EVERY_S = LEASE_TTL_S / 5
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


def still_the_run(client: Any, job_id: str, node: str, pid: int) -> bool:
    """Whether the run of ``job_id`` by pool process ``pid`` of ``node`` is still the job's
    run, for the worker's main process (Celery's hard time limit): its lease names it, or no
    lease is held and no other run has recorded itself since (``keys.runs``' ``running``).
    A zombie's time limit (its host was stopped while the job ran again elsewhere) must store
    no FAILURE over the other run's state. True when it cannot be told (Redis away)."""
    if not isinstance(client, redis.Redis):
        return True
    mine = f"{node} {pid} "
    try:
        holder = client.get(keys.lease(job_id))
        if holder is not None:
            return _text(holder).startswith(mine)
        running = client.hget(keys.runs(job_id), "running")
    except redis.RedisError:
        return True
    return running is None or _text(running).startswith(mine)


def run_lease(run: Any) -> JobLease | None:
    """The job lease a ``Run`` holds (its ``fence``), or None (the embedded mode, a bench)."""
    fence = getattr(run, "fence", None)
    return fence if isinstance(fence, JobLease) else None


def _quick(client: Any) -> Any:
    """A client of ``client``'s server whose calls give up within a renewal period: Celery's
    backend waits 120 s for an answer, and a renewal stuck that long on a dropped path would
    tell a zombie it lost its lease a minute after the path healed. A pool of another kind
    (Sentinel's) is used as it is."""
    pool = getattr(client, "connection_pool", None)
    if type(pool) is not redis.ConnectionPool:
        return client
    kwargs = {**pool.connection_kwargs, "socket_timeout": RENEW_EVERY_S,
              "socket_connect_timeout": RENEW_EVERY_S}
    return redis.Redis(connection_pool=redis.ConnectionPool(
        connection_class=pool.connection_class, max_connections=8, **kwargs))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class JobLease:
    """Held by the one run of a job; ``client`` None (embedded mode) always grants it.

    A :class:`~worker.stores.fence.Fence` for the run's writes (module docstring)."""

    def __init__(self, client: Any, job_id: str, node: str) -> None:
        self.r = _quick(client)
        self._own_client = self.r is not client  # closed at the release
        self.job = job_id
        self.key = keys.lease(job_id)
        self.gen_key = keys.lease_generation(job_id)
        self.node = node
        self.token = f"{node} {os.getpid()} {uuid.uuid4().hex}"
        #: This run's generation of the lease (its fencing token); 0 until taken.
        self.generation = 0
        self._stop = threading.Event()
        # Held by a renewal while it runs: once release() has it, no renewal can take the
        # lease again after it was deleted.
        self._renewing = threading.Lock()
        # Guards the two fields below; the writes that wait for a renewal wait on it.
        self._known = threading.Condition()
        #: Monotonic time until which the lease is held for sure: the send of the last
        #: renewal that answered, plus the lease's lifetime (Redis counts it from later).
        self.valid_until = math.inf if client is None else 0.0
        #: Another run took the lease (or the job ended): this run is a zombie, for good.
        self.lost = False
        self.lost_why = ""

    def acquire(self) -> bool:
        if self.r is None:
            return True
        sent = time.monotonic()
        generation = through_failover(lambda: self._take(LEASE_TTL_S * 1000),
                                      f"lease {self.key}")
        if not generation:
            return False
        self.generation = generation
        self._confirmed(sent)
        threading.Thread(target=self._renew, name="job-lease", daemon=True).start()
        return True

    def _take(self, px: int) -> int:
        """The new generation, or 0 while another live run holds the lease."""
        ttl = keys.SPEC_TTL_S
        taken = self.r.eval(lease_lua.LEASE_ACQUIRE, 2, self.key, self.gen_key, self.token,
                            px, ttl)
        if taken:
            return int(taken)
        holder = self.r.get(self.key)
        if holder is None:  # released just now
            return int(self.r.eval(lease_lua.LEASE_ACQUIRE, 2, self.key, self.gen_key,
                                   self.token, px, ttl))
        node, pid, *_ = _text(holder).split(" ")
        if node != self.node or _alive(int(pid)):
            return 0
        # Compare-and-set: take over the dead process's lease, unless it changed meanwhile.
        return int(self.r.eval(lease_lua.LEASE_TAKEOVER, 2, self.key, self.gen_key, holder,
                               self.token, px, ttl))

    def _renew(self) -> None:
        # A thread of its own: loading a large input or a slow first chunk reports nothing.
        while not self._stop.wait(RENEW_EVERY_S):
            with self._renewing:
                if self._stop.is_set():
                    return
                sent = time.monotonic()
                try:
                    renewed = self.r.eval(lease_lua.LEASE_RENEW, 3, self.key, self.gen_key,
                                          keys.result(self.job), self.token,
                                          LEASE_TTL_S * 1000, self.generation)
                except REDIS_DOWN as e:
                    log.warning("lease %s not renewed: %s", self.key, e)
                    continue
            if not renewed:
                self._lose()
                return
            if renewed == 2:
                log.warning("lease %s had lapsed (Redis away or this host stalled longer than "
                            "%d s); nobody took it: taken again", self.key, LEASE_TTL_S)
            self._confirmed(sent)

    def _confirmed(self, sent: float) -> None:
        with self._known:
            self.valid_until = sent + LEASE_TTL_S
            self._known.notify_all()

    def _lose(self) -> None:
        """Another run holds the lease or held it since, or the job ended: say who, for good."""
        try:
            holder, generation = self.r.get(self.key), self.r.get(self.gen_key)
            now = (f"held by {_text(holder).rsplit(' ', 1)[0]}" if holder else "free") + (
                f", generation {_text(generation)}" if generation else "")
        except redis.RedisError:
            now = "not read"
        why = (f"job {self.job}: this run (generation {self.generation} on {self.node}) lost "
               f"its lease (now {now}): its host was taken for lost and the job delivered "
               "again, or the job ended; this run stops and writes nothing more")
        with self._known:
            self.lost, self.lost_why = True, why
            self._known.notify_all()
        log.error("%s", why)

    def holds(self) -> bool:
        """Whether the lease is known held right now (no wait): a webhook may go out."""
        return not self.lost and time.monotonic() < self.valid_until

    def guard(self) -> None:
        """A run's guard (``Run.guards``): ``LeaseLost`` once the lease is lost."""
        if self.lost:
            raise LeaseLost(self.lost_why)

    def check(self, what: str) -> None:
        """The fence of a write (``worker.stores.fence.Fence``): return once the lease is
        held for ``WRITE_MARGIN_S`` more; wait while it is not known; ``LeaseLost`` once
        lost or released."""
        waited = 0.0
        with self._known:
            while True:
                if self.lost:
                    raise LeaseLost(f"{what} not written: {self.lost_why}")
                if self._stop.is_set():
                    raise LeaseLost(f"{what} not written: the run let its lease {self.key} go")
                left = self.valid_until - time.monotonic()
                if left > WRITE_MARGIN_S:
                    if waited:
                        log.warning("%s: written after %.1f s waiting for lease %s", what,
                                    waited, self.key)
                    return
                if not waited:
                    log.warning("%s waits: lease %s not confirmed (held %.1f s more at most; "
                                "Redis unreachable?)", what, self.key, max(0.0, left))
                t = time.monotonic()
                self._known.wait(1.0)
                waited += time.monotonic() - t

    def fenced_eval(self, script: str, extra_keys: tuple[str, ...], *args: Any) -> Any:
        """Run ``script`` (of ``producer.state.lease_lua``, fenced by ``holds``) with this
        lease's key, generation and token first."""
        return self.r.eval(script, 2 + len(extra_keys), self.key, self.gen_key, *extra_keys,
                           self.token, self.generation, *args)

    def release(self) -> None:
        self._stop.set()
        if self.r is None:
            return
        with self._known:
            self._known.notify_all()
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
        finally:
            if self._own_client:
                self.r.connection_pool.disconnect()
