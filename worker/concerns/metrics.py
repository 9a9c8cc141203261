"""Metrics: every run's end is counted (``framefleet_jobs_total{status,tenant}``), and a
success's timings, output and cost are recorded (``worker.metrics.observe_job``)."""

from __future__ import annotations

from worker.concerns.base import Concern, Outcome
from worker.metrics import observe_job


class JobMetrics(Concern):
    """One ``observe_job`` per run, with the outcome's status (and result on success)."""

    def on_outcome(self, outcome: Outcome) -> None:
        observe_job(outcome.status, self.run.spec.tenant, outcome.result)
