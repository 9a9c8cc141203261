"""The memory guard around a run: its checks between denoise steps and decoded chunks, and
the clean-up after a job it stopped (``worker.memory`` has the why)."""

from __future__ import annotations

from producer.wire.spec import Progress
from worker.concerns.base import Concern, Outcome
from worker.memory import check_memory, limit_mib, recover


class MemoryGuard(Concern):
    """Fails the run (fatal, naming ``FRAMEFLEET_MAX_RSS_MIB``) once the worker's RSS is
    over the limit; after such a failure, frees the job's memory."""

    sees_fenced = True  # a zombie's memory is freed too

    where = "before the run's first step"

    def before_run(self) -> None:
        if limit_mib(self.run.settings) is None:
            return
        self.run.progress_hooks.append(self._at)
        self.run.guards.append(lambda: check_memory(self.run.settings, self.where))

    def _at(self, p: Progress) -> None:
        if p.stage == "denoise":
            self.where = f"while denoising (step {p.steps_done}/{p.steps_total})"
        else:
            self.where = f"while decoding (frame {p.frames_done}/{p.frames_total})"

    def on_outcome(self, outcome: Outcome) -> None:
        recover(outcome.error, self.run.settings)
