"""The poison cap: a job whose worker keeps dying under it ends in FAILURE instead of coming
back for ever.

``acks_late`` + ``reject_on_worker_lost`` deliver a job again when its worker dies (a crash,
the OOM killer, a SIGKILL, a lost host): right for a one-off, but a job that kills every
worker it reaches would go round the fleet for ever. Each run records itself in the job's run
record (``Flags.start_run``: ``producer.state.keys.runs`` in Redis, a file in the embedded
mode) and clears the record when it ends, whatever the end (success, failure, retry, requeue,
cancel). A run that finds a record left behind knows the run before it died without ending:
one worker loss. After ``FRAMEFLEET_MAX_WORKER_LOSSES`` the job fails, naming the node it
was last lost on.

A run the stuck-job watchdog took for hung (``worker.concerns.stuck``) left its stage in the
record too: its job is delivered once more, and that delivery fails it at once with
``JobStuck`` ("stuck in decode"), whatever the cap, and counts it
(``framefleet_jobs_stuck_total``): a hang that repeats would hold another GPU for another
``FRAMEFLEET_STUCK_S``, and the first one's stacks are in its worker's log already.

Why a record of our own and not the message's ``redelivered`` flag: kombu also sets that flag
on messages it restores while their run goes on (a worker that lost its Redis connection; the
visibility timeout of a long job), it does not count, it does not say where the job died, and
a host that vanishes outright is noticed only by whoever restores its message. The record is
written after the job's lease is taken, so only one live run of a job can write it, and a
duplicate delivery waiting for the lease never counts as a loss.
"""

from __future__ import annotations

import logging
import os
import uuid

from celery import Task

from producer.errors import FatalJobError, JobStuck
from worker.concerns.base import Concern, Outcome
from worker.concerns.lease import REDIS_DOWN
from worker.run.run import Run
from worker.stuck_metrics import observe_stuck

log = logging.getLogger(__name__)


class WorkerLosses(Concern):
    """Counts the runs of this job that never ended; fails the job once they reach the cap."""

    def __init__(self, run: Run, task: Task) -> None:
        super().__init__(run, task)
        self.holder = f"{self.node} {os.getpid()} {uuid.uuid4().hex[:12]}"
        self.recorded = False

    def before_run(self) -> None:
        job_id, cap = self.run.spec.key, self.run.settings.max_worker_losses
        try:
            losses, lost_on = self.flags.start_run(job_id, self.holder)
        except REDIS_DOWN as e:  # not counted this once; a Redis blip must fail no job
            log.warning("job %s: run not recorded: %s", job_id, e)
            return
        self.recorded = True
        if losses == 0:
            return
        node = (lost_on or "?").split(" ")[0]
        self._stuck(job_id, node)
        if losses >= cap:
            # A FatalJobError (the client re-creates it without importing worker code).
            raise FatalJobError(
                f"job {job_id}: its worker was lost {losses} times (FRAMEFLEET_MAX_WORKER_LOSSES"
                f"={cap}), the last time on {node}; not delivered again"
            )
        log.warning("job %s: its worker was lost under it %d time(s), the last on %s; "
                    "running it again (it fails at %d)", job_id, losses, node, cap)

    def _stuck(self, job_id: str, node: str) -> None:
        """Fail a job whose last run was taken for hung, naming the stage (module docstring)."""
        try:
            stuck = self.flags.stuck(job_id)
        except REDIS_DOWN as e:  # counted as a plain loss this once
            log.warning("job %s: stuck mark not read: %s", job_id, e)
            return
        if stuck is None:
            return
        stage, idle_s = stuck
        observe_stuck(stage)
        raise JobStuck(
            f"job {job_id}: stuck in {stage}: its run on {node} made no progress for "
            f"{idle_s:.0f} s (FRAMEFLEET_STUCK_S={self.run.settings.stuck_s:g}); every thread's "
            "stack is in that worker's log; not delivered again")

    def on_outcome(self, outcome: Outcome) -> None:
        if not self.recorded or outcome.lost:  # a lost run's record stays: the next counts it
            return
        try:
            self.flags.end_run(self.run.spec.key, self.holder,
                                   final=outcome.status != "retry")
        except REDIS_DOWN as e:  # the next run counts this one as lost: one too many, safe
            log.warning("job %s: end of run not recorded: %s", self.run.spec.key, e)
