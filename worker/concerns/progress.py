"""Progress: the runner's reports become the job's PROGRESS state in the result backend.

At most one write every ``PROGRESS_PERIOD_S`` (the last report, all frames done, always goes
through), each naming the worker. Best effort: Redis being away fails no job.
"""

from __future__ import annotations

import logging

from celery import Task

from producer.wire.spec import Progress
from worker.concerns.base import Concern, Throttle
from worker.concerns.lease import REDIS_DOWN
from worker.run.run import Run

log = logging.getLogger(__name__)
PROGRESS_PERIOD_S = 0.2


class ProgressReport(Concern):
    """Stores throttled PROGRESS states (``Progress`` as meta) for the submitter to read."""

    def __init__(self, run: Run, task: Task) -> None:
        super().__init__(run, task)
        self.every = Throttle(PROGRESS_PERIOD_S)

    def before_run(self) -> None:
        self.run.progress_hooks.append(self.report)

    def report(self, p: Progress) -> None:
        if not self.every.due(final=p.frames_done == p.frames_total):
            return
        try:
            # The worker's name goes with every report: `status` says where a job runs. Unset
            # fields (no preview) stay out: a client older than them still reads the rest.
            meta = p.model_copy(update={"worker": self.node}).model_dump(exclude_none=True)
            self.task.update_state(state="PROGRESS", meta=meta)
        except REDIS_DOWN as e:
            log.warning("job %s: progress not stored: %s", self.run.spec.key, e)
