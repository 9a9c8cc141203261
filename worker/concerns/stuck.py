"""The stuck-job watchdog around a run: armed when the run starts, beaten by its progress.

``StuckWatch`` arms the pool process's ``worker.watchdog.WATCHDOG`` for the run with
``FRAMEFLEET_STUCK_S`` (0: off) and beats it from the run's progress reports (a denoise step, a
decoded chunk, the last segments' upload) and from each segment the live playlist lists. A run
that goes quiet that long is taken for hung: the watchdog dumps every thread's stack into the
log, the recorder the concern gave it keeps the stage in the job's run record
(``Flags.mark_stuck``), and the process ends. Its run record stays (a worker loss), so the
job's next delivery meets the poison cap (``worker.concerns.losses``), which fails it at once
with ``JobStuck``, "stuck in <stage>", and counts it (``framefleet_jobs_stuck_total``).

Last in ``CONCERNS``: it is armed once every other concern has registered its hooks, and
disarmed once they have all seen the run's end.
"""

from __future__ import annotations

import os

from celery import Task

from producer.wire.spec import Progress, SegmentInfo
from worker.concerns.base import Concern, Outcome
from worker.run.run import Run
from worker.watchdog import WATCHDOG, Watchdog


class StuckWatch(Concern):
    """Arms the process's watchdog for this run (see the module's docstring)."""

    sees_fenced = True  # disarmed whatever the end

    #: The process's watchdog (a test may give another).
    watchdog: Watchdog = WATCHDOG

    def __init__(self, run: Run, task: Task) -> None:
        super().__init__(run, task)
        self.token: object | None = None

    def before_run(self) -> None:
        limit = self.run.settings.stuck_s
        if limit <= 0:
            return
        self.run.progress_hooks.append(self._progress)
        self.run.segment_hooks.append(self._segment)
        # Read here, on the task's thread: Celery's request is per thread, and ``record`` runs
        # on the watchdog's.
        node, flags, pid = self.node, self.flags, os.getpid()

        def record(stage: str, idle_s: float) -> None:
            flags.mark_stuck(self.run.spec.key, node, pid, stage, idle_s)

        self.token = self.watchdog.arm(self.run.spec.key, limit, record)

    def _progress(self, p: Progress) -> None:
        self.watchdog.beat(p.stage)

    def _segment(self, seg: SegmentInfo, p: Progress) -> None:
        # Progress, in the stage the run is in: segments land on encoder threads while the
        # decode goes on, and a decode that hangs after one landed is stuck in decode.
        self.watchdog.beat()

    def on_outcome(self, outcome: Outcome) -> None:
        if self.token is not None:
            self.watchdog.disarm(self.token)
