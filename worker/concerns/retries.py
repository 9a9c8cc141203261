"""Retries: a retryable error runs the job again after an exponential back-off, up to a cap.

This module owns the retry budget, in one place (``retry_later``): a retry of a retryable
error spends it (``FRAMEFLEET_RETRY_MAX`` retries, delays ``FRAMEFLEET_RETRY_BACKOFF_S`` ×
2^n capped at ``FRAMEFLEET_RETRY_BACKOFF_MAX_S``), then the job fails with that error. A
requeue (a lease held elsewhere, preemption, the OOM fallback) is no failure and does not
check the budget, though Celery's retry counter still counts it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, ClassVar, NoReturn

from celery import Task

from producer.errors import RetryableError
from producer.settings import Settings
from worker.concerns.base import Concern, Failed, Outcome, Status, TaskRun

log = logging.getLogger(__name__)


def backoff(retries: int, settings: Settings) -> float:
    """Seconds before retry number ``retries + 1``."""
    return float(min(settings.retry_backoff_max_s, settings.retry_backoff_s * (2**retries)))


def retry_later(
    task: Task, *, error: BaseException | None = None, countdown: float = 0.0,
    kwargs: dict[str, Any] | None = None, retry_max: int | None = None,
) -> NoReturn:
    """Send the job again (Celery's retry; raises ``celery.exceptions.Retry``).

    ``retry_max``: the budget this retry spends; None: a requeue, allowed whatever the count.
    ``kwargs`` None keeps the task's current keyword arguments.
    """
    limit = task.request.retries + 1 if retry_max is None else retry_max
    raise task.retry(exc=error, countdown=countdown, kwargs=kwargs, max_retries=limit)


@dataclass(frozen=True)
class Retry(Outcome):
    """A retry of a retryable error after ``countdown`` s; it spends the retry budget."""

    status: ClassVar[Status] = "retry"
    countdown: float = 0.0

    def settle(self, run: TaskRun) -> NoReturn:
        retry_later(run.task, error=self.error, countdown=self.countdown,
                    retry_max=run.settings.retry_max)


@dataclass(frozen=True)
class Requeue(Outcome):
    """Back to the queue after ``countdown`` s (with ``kwargs``, if given), outside the
    budget."""

    status: ClassVar[Status] = "retry"
    countdown: float = 0.0
    kwargs: dict[str, Any] | None = None

    def settle(self, run: TaskRun) -> NoReturn:
        retry_later(run.task, error=self.error, countdown=self.countdown, kwargs=self.kwargs)


class Retries(Concern):
    """``RetryableError`` → ``Retry`` with back-off while the budget lasts, then FAILURE."""

    def on_error(self, error: BaseException) -> Outcome | None:
        if not isinstance(error, RetryableError):
            return None
        retries = self.run.task.request.retries
        if retries >= self.run.settings.retry_max:
            return Failed(error=error)
        delay = backoff(retries, self.run.settings)
        log.warning("job %s: %s; retry %d in %.1f s", self.run.spec.job_id, error, retries + 1,
                    delay)
        return Retry(error=error, countdown=delay)
