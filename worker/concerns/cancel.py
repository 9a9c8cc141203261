"""Cancel and preemption: both stop a run between chunks, and end differently.

The runner polls the flags (``producer.state.control``) between chunks, at most every
``FRAMEFLEET_CANCEL_POLL_S``: a cancel flag on the job, or a preempted flag on this node.

- Cancelled by the client → REVOKED, no manifest; the worker goes on to the next job.
- Preempted (a spot interruption notice: ``preempt_node`` has stopped this worker consuming
  and flagged the node) → the job goes back to the queue at once for another worker; a
  requeue, not a failure.

Celery's own revoke (Flower's buttons, ``celery control revoke``, ``AsyncResult.revoke``) is
this cancel too: ``revoke`` below replaces Celery's remote-control command of that name in
the worker. Celery's would keep the id in every worker's memory and drop each later message of
it, so a job_id once revoked could never run again until the workers restarted; a framefleet
job's id names its output folder, and submitting it again must run it. For a job the registry
knows, the command sets the cancel flag (with or without ``terminate``: the run stops between
chunks, within ``FRAMEFLEET_CANCEL_POLL_S``); any other id gets Celery's revoke.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, ClassVar, NoReturn

from celery import Celery, Task, states
from celery.exceptions import Ignore
from celery.utils.functional import maybe_list
from celery.worker import control

from producer.app import QUEUE
from producer.errors import JobCancelled
from producer.state.control import flags_for
from worker.concerns.base import Concern, Outcome, Status, Throttle
from worker.concerns.lease import REDIS_DOWN
from worker.concerns.retries import requeue
from worker.run.run import Run

log = logging.getLogger(__name__)


class CancelAndPreempt(Concern):
    """Polls the cancel and preempted flags; ends a stopped run as REVOKED or requeued."""

    def __init__(self, run: Run, task: Task) -> None:
        super().__init__(run, task)
        self.every = Throttle(run.settings.cancel_poll_s)
        self.preempted = False

    def before_run(self) -> None:
        self.run.cancel_checks.append(self.poll)
        job_id = self.run.spec.key
        if self.flags.cancelled(job_id):
            raise JobCancelled(f"job {job_id} was cancelled before it started")

    def poll(self) -> bool:
        if not self.every.due():
            return False
        try:
            self.preempted = self.flags.preempted(self.node)
            return self.preempted or self.flags.cancelled(self.run.spec.key)
        except REDIS_DOWN as e:  # read again at the next poll
            log.warning("job %s: cancel flags not read: %s", self.run.spec.key, e)
            return False

    def on_error(self, error: BaseException) -> Outcome | None:
        if not isinstance(error, JobCancelled):
            return None
        if self.preempted:
            # Back to the queue at once for another worker (this one no longer consumes).
            log.warning("job %s handed back: node %s is being reclaimed", self.run.spec.key,
                        self.node)
            return requeue(self.run, error)
        log.info("%s", error)
        return Revoked(error=error)


@dataclass(frozen=True)
class Revoked(Outcome):
    """REVOKED, the state a client's cancel ends in, with the cancel message; no retry."""

    status: ClassVar[Status] = "cancelled"

    def settle(self, run: Run, task: Task) -> NoReturn:
        task.update_state(state="REVOKED", meta={
            "exc_type": "JobCancelled", "exc_message": str(self.error),
            "exc_module": "producer.errors",
        })
        raise Ignore() from self.error


def preempt_node(app: Celery, node: str) -> None:
    """On a spot notice: ``node`` stops consuming, and its running job (polling the flag)
    stops between chunks and is requeued by ``CancelAndPreempt``."""
    app.control.cancel_consumer(QUEUE, destination=[node])
    flags_for(app).set_preempted(node)


#: Celery's own command (the function, not the registry entry this module replaces).
_celery_revoke = control.revoke


@control.control_command(variadic="task_id", signature="[id1 [id2 [... [idN]]]]")
def revoke(state: Any, task_id: Any, terminate: bool = False, signal: str | None = None,
           **kwargs: Any) -> dict[str, str]:
    """Revoke by task id: a framefleet job is cancelled (its cancel flag set; a resubmit runs
    it again), any other task gets Celery's revoke."""
    ids = {str(i) for i in maybe_list(task_id) or []}
    app = state.consumer.app
    flags = flags_for(app)
    jobs = {i for i in ids if flags.registered(i) is not None}
    for job in jobs:
        if app.backend.get_state(job) not in states.READY_STATES:  # a finished job stays
            flags.set_cancel(job)
    if jobs:
        log.info("revoke of %s: cancel requested (a framefleet cancel: submitting the job "
                 "again runs it)", ", ".join(sorted(jobs)))
    others = ids - jobs
    if others:
        _celery_revoke(state, sorted(others), terminate=terminate, signal=signal, **kwargs)
    return {"ok": f"cancel requested for {sorted(jobs)}; revoked {sorted(others)}"}
