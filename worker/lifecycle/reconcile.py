"""Lost messages: a job sent, never received, whose message is nowhere, is sent again.

kombu's Redis transport takes a message off its queue (``BRPOP``) before it records it as
unacknowledged (``HSET unacked``): a primary lost in between loses the message for good, and a
replica promoted after asynchronous replication may lack the last messages the primary took.
The job's own records do not depend on that message: the client claims the job (its spec
digest and its spec, ``producer.state.control``) before it sends the message, and adds the job
to the sorted set ``keys.QUEUED`` (job → time) once sent; a worker removes it when it
receives the job (``mark_started``). So the fleet can see a job that waits with no message.

Each round of the host-loss sweep's thread (``worker.lifecycle.recovery``) runs one
:meth:`Reconciler.round`:

1. the jobs of ``queued`` older than ``FRAMEFLEET_RECONCILE_AFTER_S`` (a page, oldest first);
   none: done (one ``ZRANGEBYSCORE``, the cost of a healthy fleet);
2. under a lock (one worker scans at a time), the task ids of every message in the queue's
   lists and in ``unacked`` are read until every candidate is found. A job found has a message:
   its time is set to now (``ZADD XX``), so a long backlog is scanned once per bound, not once a
   round;
3. a job missing twice in a row (two rounds of this process: a message moving between a list
   and ``unacked`` while they are read, once, is not taken for lost) goes to one Lua
   compare-and-set (``keys.RESEND``): still the time read, not received, still claimed, not
   final. It then sets the time to now (no other reconciler sends it too) and the job's spec,
   as the client claimed it, is sent again by :func:`producer.client.send.send_job`.

A duplicate message (the original found after all) is harmless: the task drops a duplicate of
a job that ended (``worker.tasks``), and one that finds the job running waits for its lease.
Each job sent again is logged and counted in Redis (``keys.RESENT``, served by the
fleet exporter as ``framefleet_jobs_resent_total``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from typing import Any

import redis

from producer.app import QUEUE
from producer.state import keys

log = logging.getLogger(__name__)

#: Candidates judged per round, and list items read per round trip.
PAGE = 200
LRANGE_PAGE = 500
#: The scan lock outlives a scan that hangs (a Redis away mid-scan) by this much.
LOCK_MS = 30_000


def task_id(raw: Any) -> str | None:
    """The task id of a kombu message as its Redis transport keeps it (a list item: the
    envelope; an ``unacked`` value: ``[envelope, exchange, routing_key]``)."""
    try:
        value = json.loads(raw)
        envelope = value[0] if isinstance(value, list) else value
        found = envelope["headers"]["id"]
    except (ValueError, TypeError, KeyError, IndexError):
        return None
    return found if isinstance(found, str) else None


class Reconciler:
    """Sends again the jobs whose message was lost (see the module docstring).

    ``backend``: the result backend's Redis (claims, run records, results, ``queued``);
    ``broker``: the broker's (queue lists, ``unacked``); ``send(job, spec_json)`` sends the
    job's message; ``meta_key(job)`` is its result key.
    """

    def __init__(self, broker: redis.Redis, backend: redis.Redis, after_s: float, node: str,
                 send: Callable[[str, str], None], meta_key: Callable[[str], str] = keys.result,
                 queues: Iterable[str] = (QUEUE,), unacked_key: str = keys.UNACKED) -> None:
        self.broker, self.backend = broker, backend
        self.after_s, self.node, self.send, self.meta_key = after_s, node, send, meta_key
        self.lists = [name for queue in queues for name in keys.queue_lists(queue)]
        self.unacked = unacked_key
        self._resend = backend.register_script(keys.RESEND)
        self._release = broker.register_script(keys.LEASE_RELEASE)
        self._suspects: dict[str, float] = {}  # job → its time, when found missing last round

    def now(self) -> float:
        seconds, micros = self.backend.time()
        return float(seconds) + float(micros) / 1e6

    def round(self) -> list[str]:
        """One look; returns the jobs sent again."""
        now = self.now()
        stale: Any = self.backend.zrangebyscore(keys.QUEUED, "-inf", now - self.after_s,
                                                start=0, num=PAGE, withscores=True)
        candidates = {_text(job): float(score) for job, score in stale}
        if not candidates:
            self._suspects.clear()
            return []
        if not self.broker.set(keys.RECONCILE_LOCK, self.node, nx=True, px=LOCK_MS):
            return []  # another worker scans now
        try:
            missing = self._missing(candidates, now)
        finally:
            self._release(keys=[keys.RECONCILE_LOCK], args=[self.node])
        confirmed = [job for job in missing if self._suspects.get(job) == candidates[job]]
        self._suspects = {job: candidates[job] for job in missing}
        return [job for job in confirmed if self._send_again(job, candidates[job], now)]

    def _missing(self, candidates: dict[str, float], now: float) -> list[str]:
        """The candidates with no message in the queue's lists nor in ``unacked``; those found
        get the time ``now``."""
        wanted = set(candidates)
        found: set[str] = set()
        for name in self.lists:  # the lists first: a message moves from them to unacked
            start = 0
            while wanted - found:
                items: Any = self.broker.lrange(name, start, start + LRANGE_PAGE - 1)
                found.update(t for t in map(task_id, items) if t in wanted)
                if len(items) < LRANGE_PAGE:
                    break
                start += LRANGE_PAGE
        if wanted - found:
            for _tag, value in self.broker.hscan_iter(self.unacked, count=LRANGE_PAGE):
                if (t := task_id(value)) in wanted:
                    found.add(t)
        if found:  # XX: a job received meanwhile (removed) is not added back
            self.backend.zadd(keys.QUEUED, dict.fromkeys(found, now), xx=True)
        return sorted(wanted - found)

    def _send_again(self, job: str, score: float, now: float) -> bool:
        verdict = _text(self._resend(
            keys=[keys.QUEUED, keys.runs(job), keys.claim(job), self.meta_key(job)],
            args=[job, repr(score), repr(now)]))
        if verdict != "resend":
            return False
        spec_json = self.backend.get(keys.spec_doc(job))
        if spec_json is None:  # claimed without its spec (an old client): nothing to send
            log.error("job %s: its message was lost and its spec was not kept: not sent again",
                      job)
            self.backend.zrem(keys.QUEUED, job)
            return False
        try:
            self.send(job, _text(spec_json))
        except Exception:
            # Not sent: its old time back, so that the next round judges it again.
            self.backend.zadd(keys.QUEUED, {job: score}, xx=True)
            raise
        self.broker.incr(keys.RESENT)
        log.warning("job %s sent again by %s: sent %.0f s ago, never received, and its message "
                    "is in no queue list and not unacknowledged (lost in a Redis failover)",
                    job, self.node, now - score)
        return True


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def app_sender(app: Any) -> Callable[[str, str], None]:
    """``send(job, spec_json)`` of a Celery app: the client's own message for that spec."""
    from producer.client.send import send_job
    from producer.settings import get_settings
    from producer.wire.spec import parse_spec

    def send(job: str, spec_json: str) -> None:
        payload = json.loads(spec_json)
        spec = parse_spec(payload)
        if spec.key != job:
            raise ValueError(f"job {job}: its kept spec is job {spec.key}")
        send_job(app, spec, payload, get_settings())

    return send
