"""Runs one job end to end: latents → pipeline → segments → manifest → ``JobResult``.

Three parts, each in its module: the latents source (``source``: load or generate), the
segment publisher (``publish``: upload, live playlist, per-segment hooks) and the finish
(``finish``: manifest last, result, cost). No Celery in here: the task lends its concerns
through the ``Run`` (``run``), so tests, benchmarks and the embedded demo call ``run_job``
directly.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch

from producer.errors import JobCancelled, NonFiniteOutput
from producer.wire.spec import JobResult, JobSpec, Progress
from worker.decoders.base import frames_for_latents
from worker.devices import out_of_memory, worker_info
from worker.generate.job import tier_name
from worker.owner import DEVICE
from worker.pipeline import PipelineReport, run_pipeline
from worker.run.decoders import DecoderCache
from worker.run.estimate import warn_if_slow
from worker.run.finish import finish, reused_output
from worker.run.previews import PreviewPublisher
from worker.run.publish import SegmentPublisher
from worker.run.run import Run
from worker.run.source import Latents, latents_for
from worker.stores.storage import JobOutput


def run_job(spec: JobSpec, decoders: DecoderCache, run: Run | None = None) -> JobResult:
    """Run ``spec`` (with the hooks of ``run``, if given); raises the error tree's exceptions
    (``JobCancelled`` when cancelled)."""
    if run is None:
        run = Run(spec)
    elif run.spec is not spec:
        raise ValueError(f"run_job: the run is of job {run.spec.job_id}, not {spec.job_id}")
    # The run owns the device: no background build starts until it ends (``worker.owner``).
    with DEVICE.job(f"run {spec.job_id}"):
        return _run(spec, decoders, run)


def _run(spec: JobSpec, decoders: DecoderCache, run: Run) -> JobResult:
    t0 = time.perf_counter()
    info = worker_info(decoders.device, run.node)
    out = JobOutput(spec.output_prefix, run.settings, fence=run.fence)
    earlier = reused_output(out, spec, info, t0)
    if earlier is not None:
        return earlier
    # Previews are written while the job denoises and decodes; their writer ends before the
    # manifest, and on an error or a cancel with what it still holds dropped.
    if spec.generate is not None:  # before its text encode and denoise: said at once
        warn_if_slow(run, decoders.device)
    with PreviewPublisher.for_run(run, out) as previews:
        latents = latents_for(run, decoders, previews.previews())
        if spec.generate is None:  # its size is the loaded latents'
            warn_if_slow(run, decoders.device, latents)
        publisher = SegmentPublisher(run, out, frames_for_latents(latents.tensor.shape[1]))
        with tempfile.TemporaryDirectory(prefix="framefleet-", dir=run.settings.work_dir) as tmp:
            report = _decode(run, latents, publisher, Path(tmp))
            full_uri = publisher.stitch(Path(tmp)) if spec.video.stitch else None
        previews.close()
        result = finish(run, out, latents, report, publisher, full_uri, info, t0, previews)
    del latents  # the decoder's tensors go before the next job's
    return result


def _decode(run: Run, latents: Latents, publisher: SegmentPublisher,
            scratch: Path) -> PipelineReport:
    """The frame pipeline over ``latents``, every segment to ``publisher``."""
    spec = run.spec

    def progress(done: int, total: int, segments: int) -> None:
        # Every frame decoded: what is left is the last segments' encode and upload.
        run.report(Progress(frames_done=done, frames_total=total, segments_done=segments,
                            stage="upload" if done >= total else "decode"))

    try:
        report = run_pipeline(
            latents.decoder, latents.tensor, video=spec.video, pipeline=spec.pipeline,
            scratch=scratch, sink=publisher, cancelled=run.cancelled, progress=progress,
        )
    except torch.OutOfMemoryError as e:
        raise out_of_memory(e, f"decoding {spec.job_id} (tiled={run.tiled})") from e
    except NonFiniteOutput as e:  # name what made the frames: the tier, or the decoder
        made_by = (tier_name(spec.generate) if spec.generate is not None
                   else f"decoder {latents.decoder.name}")
        raise NonFiniteOutput(f"{made_by}: {e}") from e
    if report.cancelled:
        raise JobCancelled(f"job {spec.job_id} cancelled after {report.stats.frames} frames")
    return report
