"""Notifications: the job's webhooks (``JobSpec.notify``), sent by ``worker.sinks.webhooks``.

``started`` once the run begins, ``preview`` as each preview is stored (while it denoises),
``segment`` as each segment is listed in the live playlist, then one of ``succeeded``,
``failed`` or ``cancelled`` when the run's end is decided. A retry or a requeue is no end: its
next run sends ``started`` again (with a higher ``attempt``). Delivery runs on the process's
notifier threads: it never blocks nor fails the job.

One end, one event: each event carries an ``event_id`` that is the same whichever run sends
it (``JobEvents.event_id``), and the end's event is sent once per submission (an end mark,
``worker.concerns.endmark``), though the run that sent it dies before its result is stored.
A run that lost its job's lease emits nothing more, and its queued events are given up.

Webhooks are configured on both sides or refused: a job that asks for them on a worker without
``FRAMEFLEET_WEBHOOK_SECRET`` (which signs every event; nothing is ever sent unsigned) fails at
once, naming ``notify``, before any work, rather than succeeding in silence.
"""

from __future__ import annotations

from celery import Task

from producer.errors import InvalidJobError
from producer.state import keys
from worker.concerns.base import Concern, Outcome
from worker.concerns.endmark import EndMark
from worker.concerns.lease import run_lease
from worker.run.run import Run
from worker.sinks.webhooks import process_notifier


class Notifications(Concern):
    """Webhook events of one run (nothing at all for a job without ``notify``)."""

    def __init__(self, run: Run, task: Task) -> None:
        super().__init__(run, task)
        # No notifier (and no delivery thread) for the jobs that ask for no webhooks, nor for
        # those this worker cannot sign (they fail in before_run).
        unsigned = run.spec.notify is None or run.settings.webhook_secret is None
        lease = run_lease(run)
        self.events = None if unsigned else process_notifier(run.settings).for_job(
            run.spec, int(task.request.retries or 0),
            holds=None if lease is None else lease.holds,
            not_lost=None if lease is None else (lambda: not lease.lost))

    def before_run(self) -> None:
        if self.run.spec.notify is not None and self.run.settings.webhook_secret is None:
            raise InvalidJobError(
                "notify: this worker has no FRAMEFLEET_WEBHOOK_SECRET, so it cannot sign "
                "webhooks and sends none; set the secret on the workers (and give it to the "
                "receivers), or submit the job without notify")
        if self.events is None:
            return
        self.run.segment_hooks.append(self.events.segment)
        self.run.preview_hooks.append(self.events.preview)
        self.events.started(self.node)

    def on_outcome(self, outcome: Outcome) -> None:
        if self.events is None or outcome.status == "retry":
            return
        mark = EndMark(getattr(self.task.app.backend, "client", None), self.run.spec,
                       keys.NOTIFIED_END_FIELD, "notified", run_lease(self.run))
        if mark.seen(outcome.status):
            return
        self._notify(outcome)
        mark.mark(outcome.status)

    def _notify(self, outcome: Outcome) -> None:
        assert self.events is not None
        if outcome.status == "success" and outcome.result is not None:
            self.events.succeeded(outcome.result)
        elif outcome.status == "failure" and outcome.error is not None:
            self.events.failed(outcome.error)
        elif outcome.status == "cancelled":
            self.events.cancelled(str(outcome.error or "cancelled"))
