"""Drives one job's frames: decoder → post-process → ring → writer → segments → sink.

``async`` mode: the main thread decodes chunk i into ring slot i mod N and hands the slot to
the writer thread, which waits for its planes, encodes them and releases the slot; the main
thread blocks only when all N slots are in flight (back-pressure). How a slot is filled is
the device's business (``launch.py``): on CUDA the main thread only queues kernels and an
asynchronous copy, on the CPU it decodes and post-processes into the slot itself.
``sequential`` mode: the naive baseline — decode, synchronous fp32 copy to the host, CPU
post-process, encode, upload, chunk by chunk on one thread.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from producer.errors import InvalidJobError
from producer.wire.spec import PipelineSpec, VideoSpec
from worker.decoders.base import TEMPORAL_RATIO, ChunkDecoder, frames_for_latents
from worker.pipeline.encode import yuv_frame
from worker.pipeline.launch import CpuLaunch, CudaLaunch, Launch, cuda_streams
from worker.pipeline.postprocess import rgb_to_yuv420, yuv420_shape
from worker.pipeline.ring import Ring
from worker.pipeline.segments import Segmenter, SegmentSink
from worker.pipeline.stats import PipelineStats
from worker.pipeline.writer import FrameTap, Writer, check_finite


@dataclass
class PipelineReport:
    frames: int
    width: int
    height: int
    cancelled: bool
    stats: PipelineStats = field(default_factory=PipelineStats)


def encoder_threads(requested: int | None) -> int:
    """Segments encoding at once. libx264 threads internally, so two segments (k finishing
    while k+1 fills) keep up with the GPU; more only add encoder buffers to host memory."""
    if requested is not None:
        return requested
    return 2 if (os.cpu_count() or 2) < 64 else 3


def run_pipeline(
    decoder: ChunkDecoder,
    latents: torch.Tensor,
    *,
    video: VideoSpec,
    pipeline: PipelineSpec,
    scratch: Path,
    sink: SegmentSink,
    cancelled: Callable[[], bool] = lambda: False,
    progress: Callable[[int, int, int], None] | None = None,
    frame_tap: FrameTap | None = None,
    tail_parts: int = 1,
) -> PipelineReport:
    """Decode ``latents`` (C, T, h, w) to MP4 segments handed to ``sink``.

    The sink runs on the encoder threads: segments that encode side by side may reach it out
    of index order (``ClosedSegment.last`` marks the job's last one). ``progress(frames_done,
    frames_total, segments_done)`` and ``cancelled()`` are called between chunks.
    ``frame_tap(first_frame, planes)`` sees each chunk's yuv420p planes on the host just before
    encoding (tests compare modes with it; copy what you keep). ``tail_parts``: the last
    chunk's frames in that many segments of their own, encoded side by side (see
    ``segments``). Errors from the decoder, the encoders or the sink propagate unchanged;
    latents whose shape does not fit the decoder raise :class:`InvalidJobError` before any
    work starts.
    """
    check_shape(decoder, latents)
    _, t, lh, lw = latents.shape
    height, width = decoder.output_size(lh, lw)
    total = frames_for_latents(t)
    stats = PipelineStats()
    report = PipelineReport(total, width, height, cancelled=False, stats=stats)
    segmenter = Segmenter(
        (height, width), video, scratch, sink, stats,
        threaded=pipeline.mode == "async", total=total,
        tail_start=frames_for_latents(t - 1), tail_parts=tail_parts,
        max_in_flight=encoder_threads(pipeline.encoder_threads),
    )
    run = _run_async if pipeline.mode == "async" else _run_sequential
    report.cancelled = run(
        decoder, latents, pipeline, segmenter, stats, total, cancelled, progress, frame_tap
    )
    return report


def check_shape(decoder: ChunkDecoder, latents: torch.Tensor) -> None:
    """Refuse latents the decoder cannot take: rank, channels, empty axes, odd frame sizes.

    Checked here, up front, so that every error the decoder raises later is a real failure
    (a kernel, the device, a bug), never bad input in disguise.
    """
    name = decoder.name
    if latents.ndim != 4:
        raise InvalidJobError(
            f"input: latents must be (C, T, h, w) for decoder {name}, "
            f"got shape {tuple(latents.shape)}"
        )
    c, t, lh, lw = latents.shape
    if c != decoder.latent_channels:
        raise InvalidJobError(
            f"input: {c} latent channels, decoder {name} expects {decoder.latent_channels}"
        )
    if t < 1 or lh < 1 or lw < 1:
        raise InvalidJobError(f"input: empty latents, shape {tuple(latents.shape)}")
    height, width = decoder.output_size(lh, lw)
    if height % 2 or width % 2:
        raise InvalidJobError(
            f"input: decoder {name} would make {width}x{height} frames; yuv420p needs even sizes"
        )


def _run_async(
    decoder: ChunkDecoder, latents: torch.Tensor, pipeline: PipelineSpec,
    segmenter: Segmenter, stats: PipelineStats, total: int,
    cancelled: Callable[[], bool], progress: Callable[[int, int, int], None] | None,
    frame_tap: FrameTap | None,
) -> bool:
    _, _, lh, lw = latents.shape
    height, width = decoder.output_size(lh, lw)
    device = decoder.device
    launch: Launch
    if device.type == "cuda":
        compute, copy = cuda_streams(device)
        ring = Ring(pipeline.ring_slots, TEMPORAL_RATIO, height, width, device, copy)
        launch = CudaLaunch(compute)
    else:
        ring = Ring(pipeline.ring_slots, TEMPORAL_RATIO, height, width, device)
        launch = CpuLaunch(stats)
    writer = Writer(ring, segmenter, stats, frame_tap)
    writer.start()
    done = 0
    try:
        with launch.active():
            chunks = iter(decoder.stream(latents))
            while True:
                slot, waited = ring.acquire(writer.check)
                stats.add(backpressure_s=waited)
                n = launch.fill(slot, chunks)
                if n is None:
                    ring.release(slot)
                    break
                slot.first_frame, slot.frames = done, n
                writer.put(slot)
                done += n
                stats.add(chunks=1, frames=n)
                if progress is not None:
                    progress(done, total, stats.segments)
                if cancelled():
                    writer.abort()
                    return True
        writer.flush()
        stats.add(window_s=launch.window_s())
        if progress is not None:
            progress(done, total, stats.segments)
        return False
    except BaseException:
        writer.abort()
        raise


def _run_sequential(
    decoder: ChunkDecoder, latents: torch.Tensor, pipeline: PipelineSpec,
    segmenter: Segmenter, stats: PipelineStats, total: int,
    cancelled: Callable[[], bool], progress: Callable[[int, int, int], None] | None,
    frame_tap: FrameTap | None,
) -> bool:
    done = 0
    sync = torch.cuda.synchronize if decoder.device.type == "cuda" else (lambda: None)
    planes_at = time.perf_counter()
    try:
        chunks = iter(decoder.stream(latents))
        while True:
            t0 = time.perf_counter()
            chunk = next(chunks, None)
            if chunk is None:
                break
            sync()
            t1 = time.perf_counter()
            host = chunk.float().cpu()  # the naive synchronous fp32 copy
            t2 = time.perf_counter()
            n = host.shape[1]
            planes = torch.empty(yuv420_shape(n, host.shape[2], host.shape[3]), dtype=torch.uint8)
            bad = torch.zeros(1, dtype=torch.int32)
            rgb_to_yuv420(host, planes, bad)
            check_finite(int(bad[0]), done, n)
            t3 = time.perf_counter()
            stats.add(decode_s=t1 - t0, d2h_s=t2 - t1, postprocess_s=t3 - t2, chunks=1, frames=n)
            planes_at = t3
            if frame_tap is not None:
                frame_tap(done, planes)
            for j in range(n):
                segmenter.add(yuv_frame(planes[j].numpy()), done + j)
            done += n
            if progress is not None:
                progress(done, total, stats.segments)
            if cancelled():
                segmenter.abort()
                return True
        segmenter.finish()
        stats.add(tail_s=time.perf_counter() - planes_at)
        if progress is not None:
            progress(done, total, stats.segments)
        return False
    except BaseException:
        segmenter.abort()
        raise
