"""Retries: a retryable error runs the job again after an exponential back-off, up to a cap.

This module owns the job's two counters, carried in the task's keyword arguments from one
send to the next:

- ``error_retries``: retries of retryable errors, the retry budget (``FRAMEFLEET_RETRY_MAX``
  retries, delays ``FRAMEFLEET_RETRY_BACKOFF_S`` × 2^n capped at
  ``FRAMEFLEET_RETRY_BACKOFF_MAX_S``); then the job fails with that error.
- ``requeues``: sends that are no failure (a lease held elsewhere, preemption, the OOM
  fallback), capped apart (``FRAMEFLEET_MAX_REQUEUES``) so that they never spend the budget.

Celery's own ``request.retries`` counts every send of both kinds, so nothing here reads it;
worker losses are counted in the job's run record (``worker.concerns.losses``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, ClassVar, NoReturn

import redis
from celery import Task
from celery.exceptions import Reject
from kombu.exceptions import OperationalError

from producer.errors import FatalJobError, RetryableError
from producer.settings import Settings
from worker.concerns.base import Concern, Failed, Outcome, Status
from worker.concerns.lease import REDIS_DOWN, through_failover
from worker.run.run import Run

log = logging.getLogger(__name__)
#: How the send of a retry rides out a broker that is away (a Redis failover): about
#: ``worker.concerns.lease.FAILOVER_S``, as a run's claim and lease do. Celery's default
#: gives up after about a second, and a retry it cannot send is rejected: the job was lost.
#: This policy covers a publish on a channel that is open; a channel that must be opened
#: anew (the connection died with the primary) fails before it, so ``retry_later`` sends the
#: whole retry again until the same bound.
SEND_THROUGH_FAILOVER = {"max_retries": 17, "interval_start": 0.2, "interval_step": 0.5,
                         "interval_max": 2.0}


def backoff(retries: int, settings: Settings) -> float:
    """Seconds before retry number ``retries + 1``."""
    return float(min(settings.retry_backoff_max_s, settings.retry_backoff_s * (2**retries)))


def retry_later(
    task: Task, *, error: BaseException | None = None, countdown: float = 0.0,
    kwargs: dict[str, Any] | None = None,
) -> NoReturn:
    """Send the job again (Celery's retry; raises ``celery.exceptions.Retry``) with the
    task's keyword arguments updated by ``kwargs``.

    Celery's retry limit never refuses: the caps are the counters of this module.
    """
    merged = {**(task.request.kwargs or {}), **(kwargs or {})}

    def send() -> NoReturn:
        try:
            raise task.retry(exc=error, countdown=countdown, kwargs=merged,
                             max_retries=task.request.retries + 1,
                             retry_policy=SEND_THROUGH_FAILOVER)
        except Reject as e:  # Celery could not send it: the broker is away?
            if isinstance(e.reason, (OperationalError, *REDIS_DOWN)):
                raise _BrokerAway(e) from e
            raise

    try:
        through_failover(send, f"job {task.request.id}: its retry not sent")
    except _BrokerAway as e:  # away longer than a failover: rejected, as Celery does
        raise e.reject from None


class _BrokerAway(redis.exceptions.ConnectionError):
    """A retry Celery could not send for want of a broker (``through_failover`` waits it out)."""

    def __init__(self, reject: Reject) -> None:
        super().__init__(str(reject.reason))
        self.reject = reject


def requeue_refused(job_id: str, requeues: int, settings: Settings,
                    why: BaseException | str) -> FatalJobError | None:
    """The error that ends a job requeued ``requeues`` times already, or None if it may go."""
    limit = settings.requeue_limit
    if requeues < limit:
        return None
    return FatalJobError(f"job {job_id} was requeued {requeues} times "
                         f"(FRAMEFLEET_MAX_REQUEUES={limit}); the last time: {why}")


def requeue_now(task: Task, job_id: str, requeues: int, settings: Settings, why: str,
                countdown: float = 0.0) -> NoReturn:
    """Requeue outside a run (a lease held elsewhere), or fail once requeued too often."""
    refused = requeue_refused(job_id, requeues, settings, why)
    if refused is not None:
        raise refused
    retry_later(task, countdown=countdown, kwargs={"requeues": requeues + 1})


def requeue(run: Run, error: BaseException, *, countdown: float = 0.0,
            kwargs: dict[str, Any] | None = None) -> Outcome:
    """A ``Requeue`` of ``run``'s job, or FAILURE once it was requeued too often."""
    refused = requeue_refused(run.spec.key, run.requeues, run.settings, error)
    if refused is not None:
        return Failed(error=refused, cause=error)
    return Requeue(error=error, countdown=countdown, kwargs=kwargs)


@dataclass(frozen=True)
class Retry(Outcome):
    """A retry of a retryable error after ``countdown`` s; it spends the retry budget."""

    status: ClassVar[Status] = "retry"
    countdown: float = 0.0

    def settle(self, run: Run, task: Task) -> NoReturn:
        retry_later(task, error=self.error, countdown=self.countdown,
                    kwargs={"error_retries": run.error_retries + 1})


@dataclass(frozen=True)
class Requeue(Outcome):
    """Back to the queue after ``countdown`` s (with ``kwargs``, if given), outside the
    retry budget; made by ``requeue``, which checks the requeue cap."""

    status: ClassVar[Status] = "retry"
    countdown: float = 0.0
    kwargs: dict[str, Any] | None = None

    def settle(self, run: Run, task: Task) -> NoReturn:
        retry_later(task, error=self.error, countdown=self.countdown,
                    kwargs={**(self.kwargs or {}), "requeues": run.requeues + 1})


class Retries(Concern):
    """``RetryableError`` → ``Retry`` with back-off while the budget lasts, then FAILURE.

    A lost Redis connection inside a run (a progress update or a cancel poll while Sentinel
    promotes a replica) is retryable too: the next delivery finds the promoted primary."""

    def on_error(self, error: BaseException) -> Outcome | None:
        if not isinstance(error, (RetryableError, *REDIS_DOWN)):
            return None
        retries = self.run.error_retries
        if retries >= self.run.settings.retry_max:
            return Failed(error=error)
        delay = backoff(retries, self.run.settings)
        log.warning("job %s: %s; retry %d in %.1f s", self.run.spec.key, error, retries + 1,
                    delay)
        return Retry(error=error, countdown=delay)
