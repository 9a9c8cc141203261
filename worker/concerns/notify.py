"""Notifications: the job's webhooks (``JobSpec.notify``), sent by ``worker.sinks.webhooks``.

``started`` once the run begins, ``segment`` as each segment is listed in the live playlist,
then one of ``succeeded``, ``failed`` or ``cancelled`` when the run's end is decided. A retry or
a requeue is no end: its next run sends ``started`` again (with a higher ``attempt``). Delivery
runs on the process's notifier thread: it never blocks nor fails the job.
"""

from __future__ import annotations

from celery import Task

from worker.concerns.base import Concern, Outcome
from worker.run.run import Run
from worker.sinks.webhooks import process_notifier


class Notifications(Concern):
    """Webhook events of one run (nothing at all for a job without ``notify``)."""

    def __init__(self, run: Run, task: Task) -> None:
        super().__init__(run, task)
        # No notifier (and no delivery thread) for the jobs that ask for no webhooks.
        self.events = None if run.spec.notify is None else process_notifier(
            run.settings).for_job(run.spec, int(task.request.retries or 0))

    def before_run(self) -> None:
        if self.events is None:
            return
        self.run.segment_hooks.append(self.events.segment)
        self.events.started(self.node)

    def on_outcome(self, outcome: Outcome) -> None:
        if self.events is None:
            return
        if outcome.status == "success" and outcome.result is not None:
            self.events.succeeded(outcome.result)
        elif outcome.status == "failure" and outcome.error is not None:
            self.events.failed(outcome.error)
        elif outcome.status == "cancelled":
            self.events.cancelled(str(outcome.error or "cancelled"))
