"""The end of a run: the manifest, written last, and the ``JobResult`` with timings and cost.

Also the beginning's shortcut: an earlier run of the same spec that left a complete output
(its manifest present, every segment there) is returned as ``reused`` instead of run again.
"""

from __future__ import annotations

import time

from producer.cost import with_denoise, with_stages
from producer.cost.model import NAMED_STAGES
from producer.errors import JobConflictError
from producer.wire.spec import JobResult, JobSpec, Manifest, StageTimings, WorkerInfo, segment_name
from producer.wire.weights import uses_random_weights
from worker.generate.handoff import LATENTS_FILE, latents_file
from worker.pipeline import PipelineReport
from worker.run.previews import PreviewPublisher
from worker.run.publish import SegmentPublisher
from worker.run.run import Run
from worker.run.source import Latents
from worker.stores.storage import JobOutput

#: The completion marker: written after everything else of the job's output.
MANIFEST = "manifest.json"


def reused_output(out: JobOutput, spec: JobSpec, info: WorkerInfo,
                  t0: float) -> JobResult | None:
    """An earlier run left a complete output (manifest present): verify and return it."""
    if not out.exists(MANIFEST):
        return None
    manifest = Manifest.model_validate_json(out.get_bytes(MANIFEST))
    if manifest.spec_digest != spec.digest():
        raise JobConflictError(
            f"job_id {spec.job_id!r}: {out.uri(MANIFEST)} was written by a different spec"
        )
    for seg in manifest.segments:
        if not out.exists(segment_name(seg.index)):
            return None  # incomplete (deleted by hand?): run again, overwriting
    if manifest.latents_uri is not None and not out.exists(LATENTS_FILE):
        return None
    return JobResult(
        manifest=manifest, manifest_uri=out.uri(MANIFEST),
        timings=StageTimings(wall_s=time.perf_counter() - t0), worker=info, reused=True,
        finished_at=time.time(),
    )


def finish(run: Run, out: JobOutput, latents: Latents, report: PipelineReport,
           publisher: SegmentPublisher, full_uri: str | None, info: WorkerInfo,
           t0: float, previews: PreviewPublisher | None = None) -> JobResult:
    """Save the latents if asked, end the playlist, write the manifest LAST, and account
    (``previews``: the run's preview writer, closed)."""
    spec = run.spec
    if previews is not None and latents.facts is not None:
        latents.seconds["preview"] = previews.seconds
        latents.facts = latents.facts.model_copy(update={
            "preview_every": previews.every, "previews": previews.published})
    latents_uri = None
    if spec.generate is not None and spec.generate.save_latents:
        latents_uri = out.put_bytes(LATENTS_FILE, latents_file(latents.tensor),
                                    "application/octet-stream")
    segments = tuple(publisher.segments)
    manifest = Manifest(
        job_id=spec.job_id, tenant=spec.tenant, spec_digest=spec.digest(), frames=report.frames,
        width=report.width, height=report.height, fps=spec.video.fps,
        video_seconds=report.frames / spec.video.fps, segments=segments, full_uri=full_uri,
        playlist_uri=publisher.finish(), latents_uri=latents_uri,
        random_weights=uses_random_weights(spec.decoder) or (
            latents.facts is not None and latents.facts.random_weights),
        generate=latents.facts,
    )
    # The manifest goes LAST: its presence is the completion marker.
    manifest_uri = out.put_bytes(MANIFEST, manifest.model_dump_json(indent=2).encode())
    stats = report.stats
    wall = time.perf_counter() - t0
    before = {f"{stage}_s": s for stage, s in latents.seconds.items()}
    timings = StageTimings(**before, **stats.stage_seconds(), backpressure_s=stats.backpressure_s,
                           wall_s=wall, gpu_busy_ratio=stats.gpu_busy_ratio)
    cost = None
    if run.cost is not None:
        stored = sum(s.bytes for s in segments) + (previews.stored_bytes if previews else 0)
        direct = run.cost(spec, wall, out.puts, stored, manifest.video_seconds)
        cost = with_stages(direct, _cost_seconds(latents, previews, direct.gpu_seconds,
                                                 stats.backpressure_s + stats.tail_s))
        if latents.facts is not None:
            cost = with_denoise(cost, latents.facts, latents.seconds.get("denoise", 0.0))
    return JobResult(manifest=manifest, manifest_uri=manifest_uri, timings=timings, worker=info,
                     cost=cost, finished_at=time.time())


def _cost_seconds(latents: Latents, previews: PreviewPublisher | None,
                  gpu_seconds: float, waited_s: float) -> dict[str, float]:
    """GPU-seconds per named cost stage. The previews' projection ran inside the denoise: it
    moves from ``denoise`` to ``preview``, with the encodes (which overlap the decode), within
    what the job held. ``waited_s``: the device held idle for the encode and upload (a full
    ring, the tail): ``upload_wait``, out of what the job held."""
    named = ("upload_wait", "preview")
    seconds = {k: latents.seconds.get(k, 0.0) for k in NAMED_STAGES if k not in named}
    if previews is not None and previews.seconds > 0:
        seconds["denoise"] = max(0.0, seconds.get("denoise", 0.0) - previews.gpu_s)
        seconds["preview"] = min(previews.seconds, max(0.0, gpu_seconds - sum(seconds.values())))
    seconds["upload_wait"] = min(waited_s, max(0.0, gpu_seconds - sum(seconds.values())))
    return seconds
