"""Runs one job end to end: input → decoder → pipeline → segments → manifest → JobResult.

No Celery in here: the task layer passes plain callables for progress and cancellation, so the
runner is what tests, benchmarks and the embedded demo call directly.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from producer.cost import with_stages
from producer.errors import JobCancelled, JobConflictError
from producer.settings import Settings, get_settings
from producer.spec import (
    CostReport,
    DecoderSpec,
    JobResult,
    JobSpec,
    Manifest,
    Progress,
    SegmentInfo,
    StageTimings,
    WorkerInfo,
    segment_name,
)
from producer.weights import uses_random_weights
from worker.decoders.base import ChunkDecoder, frames_for_latents
from worker.devices import out_of_memory, resolve_device, worker_info
from worker.generate import ModelCache, generate_latents
from worker.generate.handoff import LATENTS_FILE, latents_file
from worker.inputs.latents import load_latents
from worker.inputs.weights import resolve_weights
from worker.pipeline import ClosedSegment, run_pipeline
from worker.pipeline.encode import concat_segments
from worker.sinks.hls import LivePlaylist
from worker.sinks.storage import JobOutput

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
CostFn = Callable[[JobSpec, float, int, int, float], CostReport]


class DecoderCache:
    """Decoders built once per worker process and reused (weights loaded, warmed up)."""

    def __init__(
        self, device: torch.device, capacity: int = 2, graphs: int = 0,
        models: ModelCache | None = None, settings: Settings | None = None,
    ) -> None:
        """``graphs``: compiled decode graphs each Wan decoder keeps (see decoders/wan_graph).
        ``models``: the generation pipelines resident beside the decoders (worker/generate).
        ``settings``: where weights folders may lie (FRAMEFLEET_FILE_ROOTS); default: the
        process's settings."""
        self.settings = settings
        self.device = device
        self.capacity = capacity
        self.graphs = graphs
        self._cache: OrderedDict[tuple[object, ...], ChunkDecoder] = OrderedDict()
        self.models = models or ModelCache(device, 2**40, graphs=graphs)

    def get(self, spec: DecoderSpec) -> ChunkDecoder:
        key = (spec.name, spec.weights, spec.preset, spec.dtype, spec.seed)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        decoder = self._build(spec)
        self._cache[key] = decoder
        while len(self._cache) > self.capacity:
            self._cache.popitem(last=False)
        return decoder

    def _build(self, spec: DecoderSpec) -> ChunkDecoder:
        # The weights are resolved here, where the decoder is chosen: a job that names none,
        # or a folder that is not there, fails before any model is built.
        weights = resolve_weights(spec, self.settings or get_settings())
        if spec.name == "pattern":
            from worker.decoders.pattern import PatternDecoder

            return PatternDecoder(self.device)
        from worker.decoders.wan import DTYPES, WanDecoder, build_vae

        name = spec.dtype
        if name == "auto":
            name = "bfloat16" if self.device.type == "cuda" else "float32"
        vae = build_vae(spec.preset, weights, spec.seed, DTYPES[name], device=self.device)
        return WanDecoder(vae, self.device, graphs=self.graphs)


@dataclass
class JobContext:
    """What the caller (Celery task, demo, bench) lends the runner."""

    progress: Callable[[Progress], None] = lambda p: None
    cancelled: Callable[[], bool] = lambda: False
    #: Each segment once it is listed in the live playlist, in index order (webhooks).
    segment_landed: Callable[[SegmentInfo, Progress], None] = lambda seg, p: None
    #: Called with the job's live playlist once the run creates it (to end it early).
    playlist_opened: Callable[[LivePlaylist], None] = lambda playlist: None
    cost: CostFn | None = None
    node: str | None = None
    tiled: bool = False  # decode in spatial tiles: the smaller working set after a CUDA OOM
    settings: Settings = field(default_factory=get_settings)


def _reuse(out: JobOutput, spec: JobSpec, info: WorkerInfo, t0: float) -> JobResult | None:
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


def run_job(spec: JobSpec, decoders: DecoderCache, ctx: JobContext | None = None) -> JobResult:
    """Run ``spec``; raises the error tree's exceptions (JobCancelled when cancelled)."""
    ctx = ctx or JobContext()
    settings = ctx.settings
    t0 = time.perf_counter()
    info = worker_info(decoders.device, ctx.node)
    out = JobOutput(spec.output_prefix, settings)
    reused = _reuse(out, spec, info, t0)
    if reused is not None:
        return reused
    text_encode_s = denoise_s = 0.0
    if spec.generate is not None:
        # Prompt in: the latents are denoised here and stay on the GPU for the decoder.
        gen = generate_latents(
            spec.generate, decoders.models, settings, job_id=spec.job_id,
            progress=ctx.progress, cancelled=ctx.cancelled, lean=ctx.tiled,
        )
        decoder, latents = gen.decoder, gen.latents
        load_s, text_encode_s, denoise_s = gen.load_s, gen.text_encode_s, gen.denoise_s
    else:
        assert spec.input is not None  # JobSpec: exactly one of input and generate
        decoder = decoders.get(spec.decoder)
        if ctx.tiled and hasattr(decoder, "with_tiling"):
            decoder = decoder.with_tiling()
        latents = load_latents(spec.input, decoder.latent_channels, settings)
        load_s = time.perf_counter() - t0
    segments: list[SegmentInfo] = []
    total = frames_for_latents(latents.shape[1])
    playlist = LivePlaylist(out, spec.video, on_listed=lambda s: ctx.segment_landed(s, Progress(
        frames_done=s.first_frame + s.frames, frames_total=total, segments_done=s.index + 1)),
        digest=spec.digest())
    ctx.playlist_opened(playlist)
    kept = playlist.resume()
    if kept:
        log.info("job %s: the live playlist lists %d segments already: they are kept",
                 spec.job_id, kept)

    def sink(seg: ClosedSegment) -> None:
        name = segment_name(seg.index)
        init, size, sha256 = seg.file.init_bytes, seg.file.bytes, seg.file.sha256
        # A segment a player may have seen (listed by an earlier run) is kept as stored.
        stored = playlist.reuse(seg.index, max_bytes=4 * size + 2**20)
        if stored is None:
            uri = out.put_file(name, seg.file.path)
        else:
            data, init = stored
            seg.file.path.write_bytes(data)  # what full.mp4 is stitched from
            uri, size, sha256 = out.uri(name), len(data), hashlib.sha256(data).hexdigest()
        info = SegmentInfo(
            index=seg.index, uri=uri, first_frame=seg.first_frame, frames=seg.file.frames,
            bytes=size, sha256=sha256, seconds=seg.file.frames / spec.video.fps,
        )
        segments.append(info)
        playlist.landed(info, init)

    def progress(done: int, total: int, segs: int) -> None:
        ctx.progress(Progress(frames_done=done, frames_total=total, segments_done=segs))

    with tempfile.TemporaryDirectory(prefix="framefleet-", dir=settings.work_dir) as tmp:
        try:
            report = run_pipeline(
                decoder, latents, video=spec.video, pipeline=spec.pipeline, scratch=Path(tmp),
                sink=sink, cancelled=ctx.cancelled, progress=progress,
            )
        except torch.OutOfMemoryError as e:
            raise out_of_memory(e, f"decoding {spec.job_id} (tiled={ctx.tiled})") from e
        if report.cancelled:
            raise JobCancelled(f"job {spec.job_id} cancelled after {report.stats.frames} frames")
        segments.sort(key=lambda s: s.index)
        full_uri = None
        if spec.video.stitch:
            full = concat_segments(
                [Path(tmp) / segment_name(s.index) for s in segments], Path(tmp) / "f.mp4"
            )
            full_uri = out.put_file("full.mp4", full.path)
    latents_uri = None
    if spec.generate is not None and spec.generate.save_latents:
        latents_uri = out.put_bytes(LATENTS_FILE, latents_file(latents), "application/octet-stream")
    del latents
    playlist_uri = playlist.finish()
    video_seconds = report.frames / spec.video.fps
    manifest = Manifest(
        job_id=spec.job_id, tenant=spec.tenant, spec_digest=spec.digest(), frames=report.frames,
        width=report.width, height=report.height, fps=spec.video.fps,
        video_seconds=video_seconds, segments=tuple(segments), full_uri=full_uri,
        playlist_uri=playlist_uri,
        latents_uri=latents_uri,
        random_weights=uses_random_weights(spec.decoder),
    )
    # The manifest goes LAST: its presence is the completion marker.
    manifest_uri = out.put_bytes(MANIFEST, manifest.model_dump_json(indent=2).encode())
    stats = report.stats
    wall = time.perf_counter() - t0
    timings = StageTimings(
        load_s=load_s, text_encode_s=text_encode_s, denoise_s=denoise_s,
        **stats.stage_seconds(), backpressure_s=stats.backpressure_s,
        wall_s=wall, gpu_busy_ratio=stats.gpu_busy_ratio,
    )
    stored = sum(s.bytes for s in segments)
    cost = ctx.cost(spec, wall, out.puts, stored, video_seconds) if ctx.cost else None
    if cost is not None:
        cost = with_stages(cost, {"text_encode": text_encode_s, "denoise": denoise_s})
    return JobResult(
        manifest=manifest, manifest_uri=manifest_uri, timings=timings, worker=info, cost=cost,
        finished_at=time.time(),
    )


def default_decoders(settings: Settings | None = None) -> DecoderCache:
    settings = settings or get_settings()
    device = resolve_device(settings.device)
    models = ModelCache(device, int(settings.model_cache_gib * 2**30),
                        settings.text_encoder_offload, graphs=settings.decode_graphs)
    return DecoderCache(device, graphs=settings.decode_graphs, models=models, settings=settings)
