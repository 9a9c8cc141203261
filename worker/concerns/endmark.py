"""An end recorded once per submission, though the run that recorded it may die, or may be a
zombie.

A run that ends its job records the end (``framefleet_jobs_total``, the ledger's record, the
end's webhook) before Celery stores the job's state. SIGKILLed in between (a pool process
killed, a host lost), its message comes again and the next run ends the same way: a second
count, a second record. Each kind of record leaves a mark in the job's run record
(``producer.state.keys.runs``, one field per kind: ``"<spec digest> <status>"``, and beside it
``<field>:by``, the run that left it); a run that finds the same end marked records nothing.
A resubmit clears the marks (``Flags.take_started``): its end is a new one.

The mark is written only while the run holds the job's lease, checked in the same Lua script
(``producer.state.lease_lua.FENCED_HSET``): a zombie (``worker.concerns.fencing``) leaves
none. The embedded mode (no Redis) has no marks: one host, nothing to deliver again.
"""

from __future__ import annotations

import logging
from typing import Any

import redis

from producer.state import keys, lease_lua
from producer.wire.spec import JobSpec
from worker.concerns.lease import JobLease

log = logging.getLogger(__name__)


class EndMark:
    """The mark of one kind of record (``field``) of ``spec``'s end, in ``client`` (the
    result backend's Redis; anything else: no marks), written under ``lease`` (the run's;
    None: unfenced, for an end decided outside a run)."""

    def __init__(self, client: Any, spec: JobSpec, field: str, what: str,
                 lease: JobLease | None = None) -> None:
        self.r = client if isinstance(client, redis.Redis) else None
        self.spec, self.field, self.what = spec, field, what
        self.lease = lease if lease is not None and lease.generation else None
        #: The last ``mark`` was refused in Redis: this run no longer holds the job's lease.
        self.refused = False

    def _value(self, status: str) -> str:
        return f"{self.spec.digest()} {status}"

    def seen(self, status: str) -> bool:
        """This submission's ``status`` end has its record already (logged, naming the run
        that made it); False when the mark cannot be read: a second record is better than
        none."""
        if self.r is None:
            return False
        try:
            mark, by = self.r.hmget(keys.runs(self.spec.key), self.field, f"{self.field}:by")
        except redis.RedisError:
            return False
        if mark is None or _text(mark) != self._value(status):
            return False
        who = f"by {_text(by)}" if by is not None else "by an earlier run"
        if self.lease is not None and self.lease.lost:
            log.warning("job %s: its %s is %s already, %s, which took the job over from this "
                        "run (it lost the job's lease): not again", self.spec.key, status,
                        self.what, who)
        else:
            log.warning("job %s: its %s is %s already, %s of this submission (a run that "
                        "ended it and was lost before its result was stored): not again",
                        self.spec.key, status, self.what, who)
        return True

    def extra(self, name: str) -> str | None:
        """What the mark was left with as ``name`` (``mark(..., name=...)``), or None."""
        if self.r is None:
            return None
        try:
            value = self.r.hget(keys.runs(self.spec.key), f"{self.field}:{name}")
        except redis.RedisError:
            return None
        return None if value is None else _text(value)

    def mark(self, status: str, **extra: str) -> bool:
        """Leave the mark (and ``extra`` beside it, each as ``<field>:<name>``); False when it
        was not left (Redis away, or the run lost its lease: ``refused``, said in the log)."""
        if self.r is None:
            return True
        pairs = [x for name, value in extra.items() for x in (f"{self.field}:{name}", value)]
        try:
            if self.lease is None:
                self.r.hset(keys.runs(self.spec.key), mapping={
                    self.field: self._value(status), **dict(zip(pairs[::2], pairs[1::2],
                                                                strict=True))})
                return True
            by = f"generation {self.lease.generation} on {self.lease.node}"
            if self.lease.fenced_eval(lease_lua.FENCED_HSET, (keys.runs(self.spec.key),),
                                      self.field, self._value(status), f"{self.field}:by", by,
                                      *pairs, keys.SPEC_TTL_S):
                return True
            self.refused = True
            log.warning("job %s: %s end not marked: this run (%s) no longer holds the job's "
                        "lease", self.spec.key, self.what, by)
        except redis.RedisError as e:
            log.warning("job %s: %s end not marked: %s", self.spec.key, self.what, e)
        return False


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
