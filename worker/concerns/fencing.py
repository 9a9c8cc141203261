"""Fencing: a run that lost its job's lease (a zombie) ends without ending the job.

A worker cut off from Redis longer than the lease (a partition, a host stopped or starved)
is taken for lost: the host-loss sweep delivers its job again and another run takes the
lease, with a newer generation. Once the zombie learns it (its next renewal after the path
heals: ``worker.concerns.lease``), it stops at its next chunk or step (a guard), and every
write it still tries raises ``LeaseLost`` (``worker.stores.fence``; Redis writes are refused
in Redis). Its end is :class:`Fenced`: no count, no ledger record, no webhook, no playlist
end, no result (Celery stores nothing: ``Ignore``); only the concerns with ``sees_fenced``
(the device time it held, its memory, the watchdog) see it. Its log says what happened.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import ClassVar, NoReturn

from celery import Task
from celery.exceptions import Ignore

from producer.errors import LeaseLost
from worker.concerns.base import Concern, Outcome, Status
from worker.concerns.lease import JobLease
from worker.run.run import Run

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Fenced(Outcome):
    """The run lost its lease: nothing of the job's is stored (``Ignore``)."""

    status: ClassVar[Status] = "fenced"

    def settle(self, run: Run, task: Task) -> NoReturn:
        log.warning("job %s: this run stopped without an end (%s: %s); the run that holds "
                    "the lease ends the job", run.spec.key, type(self.error).__name__,
                    self.error)
        raise Ignore()


class Fencing(Concern):
    """Stops the run once its lease is lost, and turns any error of a zombie into ``Fenced``."""

    def before_run(self) -> None:
        lease = self.run.fence
        if isinstance(lease, JobLease):
            self.run.guards.insert(0, lease.guard)

    def on_error(self, error: BaseException) -> Outcome | None:
        lease = self.run.fence
        lost = isinstance(lease, JobLease) and lease.lost
        if isinstance(error, LeaseLost) or lost:
            return Fenced(error=error)
        return None
