"""An end recorded once per submission, though the run that recorded it may die.

A run that ends its job records the end (``framefleet_jobs_total``, the ledger's record)
before Celery stores the job's state. SIGKILLed in between (a pool process killed, a host
lost), its message comes again and the next run ends the same way: a second count, a second
record. Each kind of record leaves a mark in the job's run record (``producer.state.keys.runs``,
one field per kind: ``"<spec digest> <status>"``); a run that finds the same end marked
records nothing. A resubmit clears the marks (``Flags.take_started``): its end is a new one.
The embedded mode (no Redis) has no marks: one host, nothing to deliver again.
"""

from __future__ import annotations

import logging
from typing import Any

import redis

from producer.state import keys
from producer.wire.spec import JobSpec

log = logging.getLogger(__name__)


class EndMark:
    """The mark of one kind of record (``field``) of ``spec``'s end, in ``client`` (the
    result backend's Redis; anything else: no marks)."""

    def __init__(self, client: Any, spec: JobSpec, field: str, what: str) -> None:
        self.r = client if isinstance(client, redis.Redis) else None
        self.spec, self.field, self.what = spec, field, what

    def _value(self, status: str) -> str:
        return f"{self.spec.digest()} {status}"

    def seen(self, status: str) -> bool:
        """This submission's ``status`` end has its record already (logged); False when
        the mark cannot be read: a second record is better than none."""
        if self.r is None:
            return False
        try:
            mark = self.r.hget(keys.runs(self.spec.key), self.field)
        except redis.RedisError:
            return False
        if mark is None:
            return False
        if (mark.decode() if isinstance(mark, bytes) else mark) != self._value(status):
            return False
        log.warning("job %s: its %s is %s already, by a run that died before its result was "
                    "stored: not again", self.spec.key, status, self.what)
        return True

    def mark(self, status: str) -> None:
        if self.r is None:
            return
        try:
            self.r.hset(keys.runs(self.spec.key), self.field, self._value(status))
        except redis.RedisError as e:
            log.warning("job %s: %s end not marked: %s", self.spec.key, self.what, e)
