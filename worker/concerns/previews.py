"""Previews: each one a generate job could not make or store is counted
(``framefleet_preview_failures_total``). The job goes on and the next preview tries again
(``worker.run.previews``); their webhooks go with the others (``Notifications``)."""

from __future__ import annotations

from worker import metrics
from worker.concerns.base import Concern


class PreviewFailures(Concern):
    """Counts the run's failed previews in the worker's metrics."""

    def before_run(self) -> None:
        if self.run.spec.generate is not None:
            self.run.preview_failure_hooks.append(lambda _: metrics.PREVIEW_FAILURES.inc())
