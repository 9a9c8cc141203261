"""One run of one job: what the run's parts and the task's concerns share. No Celery in here.

A ``Run`` is created per delivery of a job (by the task, or by a test, a benchmark or the
demo calling ``run_job`` directly). The task's concerns (``worker.concerns``) attach to it
before it starts: they append to its hook lists, and read what the run left on it (the live
playlist it opened). The run's three parts call it back:

- the latents source (``worker.run.source``) reports denoise steps and polls for cancellation
  (and the guards);
- the preview writer (``worker.run.previews``) announces each preview it stored, and each
  that failed; every progress report after one carries the newest;
- the segment publisher (``worker.run.publish``) announces each segment the live playlist
  lists, and leaves the playlist on the run (so a concern can end it early);
- the pipeline reports frames and polls for cancellation between chunks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from producer.settings import Settings, get_settings
from producer.wire.spec import CostReport, JobSpec, PreviewInfo, Progress, SegmentInfo

if TYPE_CHECKING:
    from worker.sinks.hls import LivePlaylist
    from worker.stores.fence import Fence

#: ``cost(spec, wall_s, s3_puts, stored_bytes, video_s)``: the job's direct cost report.
CostFn = Callable[[JobSpec, float, int, int, float], CostReport]


@dataclass
class Run:
    """One run of ``spec`` on this worker, and the hooks attached to it."""

    spec: JobSpec
    settings: Settings = field(default_factory=get_settings)
    #: The worker's node name (``gpu0@host``); None outside a Celery worker.
    node: str | None = None
    #: The smaller working set after a device out-of-memory (spatial tiles, lean models).
    tiled: bool = False
    cost: CostFn | None = None
    #: Retries of retryable errors this job has spent, and its requeues (``concerns.retries``).
    error_retries: int = 0
    requeues: int = 0
    #: Called with each progress report: denoise steps, then frames.
    progress_hooks: list[Callable[[Progress], None]] = field(default_factory=list)
    #: Polled between denoise steps and chunks; one True stops the run with JobCancelled.
    cancel_checks: list[Callable[[], bool]] = field(default_factory=list)
    #: Called at the same polls, before the cancel checks; one raises to stop the run with
    #: its error (the memory guard).
    guards: list[Callable[[], None]] = field(default_factory=list)
    #: Called with each segment once the live playlist lists it, in index order.
    segment_hooks: list[Callable[[SegmentInfo, Progress], None]] = field(default_factory=list)
    #: The job's live playlist, once this run's publisher opened it.
    playlist: LivePlaylist | None = None
    #: Called with each preview once it is stored, in step order (on the preview writer).
    preview_hooks: list[Callable[[PreviewInfo], None]] = field(default_factory=list)
    #: Called with the error of each preview that could not be made or stored (the run goes on).
    preview_failure_hooks: list[Callable[[BaseException], None]] = field(default_factory=list)
    #: The newest preview stored: every progress report from then on carries it.
    preview: PreviewInfo | None = None

    #: Said with every progress report (a CPU worker's estimate of a long job).
    warning: str | None = None
    #: The job's lease (``worker.concerns.lease``): every write of the run's output, and its
    #: end, lands only while the run holds it. None: no lease (the embedded mode, a bench).
    fence: Fence | None = None

    def report(self, progress: Progress) -> None:
        if self.preview is not None and progress.preview is None:
            progress = progress.model_copy(update={"preview": self.preview})
        if self.warning is not None and progress.warning is None:
            progress = progress.model_copy(update={"warning": self.warning})
        for hook in self.progress_hooks:
            hook(progress)

    def cancelled(self) -> bool:
        for guard in self.guards:
            guard()
        return any(check() for check in self.cancel_checks)

    def segment_landed(self, seg: SegmentInfo, progress: Progress) -> None:
        for hook in self.segment_hooks:
            hook(seg, progress)

    def preview_landed(self, preview: PreviewInfo) -> None:
        self.preview = preview
        for hook in self.preview_hooks:
            hook(preview)

    def preview_failed(self, error: BaseException) -> None:
        for hook in self.preview_failure_hooks:
            hook(error)
