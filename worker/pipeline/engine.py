"""Drives one job's frames: decoder → post-process → ring → writer → segments → sink.

``async`` mode, CUDA: the main thread only launches work. Chunk i is decoded and post-processed
on the compute stream into slot i mod N's GPU staging; the copy stream waits on that (event
``processed``) and copies into the slot's pinned host buffer (event ``copied``); the writer waits
on ``copied``. The main thread blocks only when all N slots are in flight (back-pressure).
``async`` mode, CPU: the same code without streams/events; the post-process writes the host
buffer directly, and decoding still overlaps encoding/upload through the writer thread.
``sequential`` mode: the naive baseline — decode, synchronous fp32 copy to the host, CPU
post-process, encode, upload, chunk by chunk on one thread.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from producer.errors import InvalidJobError
from producer.spec import PipelineSpec, VideoSpec
from worker.decoders.base import TEMPORAL_RATIO, ChunkDecoder, frames_for_latents
from worker.encode import yuv_frame
from worker.pipeline.postprocess import rgb_to_yuv420, yuv420_shape
from worker.pipeline.ring import HostChunk, Ring
from worker.pipeline.segments import Segmenter, SegmentSink
from worker.pipeline.stats import PipelineStats
from worker.pipeline.writer import FrameTap, Writer


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


@functools.cache
def cuda_streams(device: torch.device) -> tuple[torch.cuda.Stream, torch.cuda.Stream]:
    """(compute, copy) streams of ``device``, created once per worker process.

    The caching allocator keeps freed blocks per stream: new streams for every job would
    strand the previous job's cached working set and cudaMalloc a fresh one.
    """
    return torch.cuda.Stream(device), torch.cuda.Stream(device)


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
) -> PipelineReport:
    """Decode ``latents`` (C, T, h, w) to MP4 segments handed to ``sink`` in order of index.

    ``progress(frames_done, frames_total, segments_done)`` and ``cancelled()`` are called
    between chunks. ``frame_tap(first_frame, planes)`` sees each chunk's yuv420p planes on the
    host just before encoding (tests compare modes with it; copy what you keep). Errors from
    the decoder, the encoders or the sink propagate unchanged.
    """
    _, t, lh, lw = latents.shape
    height, width = decoder.output_size(lh, lw)
    total = frames_for_latents(t)
    stats = PipelineStats()
    report = PipelineReport(total, width, height, cancelled=False, stats=stats)
    segmenter = Segmenter(
        (height, width), video, scratch, sink, stats,
        threaded=pipeline.mode == "async",
        max_in_flight=encoder_threads(pipeline.encoder_threads),
    )
    run = _run_async if pipeline.mode == "async" else _run_sequential
    report.cancelled = run(
        decoder, latents, pipeline, segmenter, stats, total, cancelled, progress, frame_tap
    )
    return report


def _decoded_chunks(decoder: ChunkDecoder, latents: torch.Tensor) -> Iterator[torch.Tensor]:
    """The decoder's chunks; a shape mismatch inside the model becomes a fatal input error."""
    try:
        yield from decoder.stream(latents)
    except torch.OutOfMemoryError:
        raise  # mapped to a retryable error by the runner
    except (RuntimeError, ValueError) as e:
        if "Expected" in str(e) or "size" in str(e) or "shape" in str(e):
            raise InvalidJobError(f"input: latents do not fit decoder {decoder.name}: {e}") from e
        raise


def _run_async(
    decoder: ChunkDecoder, latents: torch.Tensor, pipeline: PipelineSpec,
    segmenter: Segmenter, stats: PipelineStats, total: int,
    cancelled: Callable[[], bool], progress: Callable[[int, int, int], None] | None,
    frame_tap: FrameTap | None,
) -> bool:
    _, _, lh, lw = latents.shape
    height, width = decoder.output_size(lh, lw)
    device = decoder.device
    cuda = device.type == "cuda"
    ring = Ring(pipeline.ring_slots, TEMPORAL_RATIO, height, width, device)
    writer = Writer(ring, segmenter, stats, frame_tap)
    writer.start()
    compute, copy = cuda_streams(device) if cuda else (None, None)
    window: tuple[torch.cuda.Event, torch.cuda.Event] | None = None
    if cuda:
        window = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
    done = 0
    try:
        stream_ctx = torch.cuda.stream(compute) if compute is not None else contextlib.nullcontext()
        with stream_ctx:
            if window is not None:
                window[0].record()
            chunks = _decoded_chunks(decoder, latents)
            while True:
                slot, waited = ring.acquire(writer.check)
                stats.add(backpressure_s=waited)
                if slot.start is not None:
                    slot.start.record()
                t0 = time.perf_counter()
                chunk = next(chunks, None)
                if chunk is None:
                    ring.release(slot)
                    break
                n = chunk.shape[1]
                slot.first_frame, slot.frames = done, n
                if cuda:
                    assert slot.staging is not None and copy is not None
                    slot.decoded.record()
                    rgb_to_yuv420(chunk, slot.staging[:n])
                    slot.processed.record()
                    # The copy stream starts only once the post-process has written staging;
                    # staging belongs to the slot, so no allocator reuse can race the copy.
                    copy.wait_event(slot.processed)
                    with torch.cuda.stream(copy):
                        slot.host[:n].copy_(slot.staging[:n], non_blocking=True)
                        slot.copied.record()
                else:
                    t1 = time.perf_counter()
                    rgb_to_yuv420(chunk, slot.host[:n])
                    stats.add(decode_s=t1 - t0, postprocess_s=time.perf_counter() - t1)
                del chunk
                writer.put(HostChunk(slot))
                done += n
                stats.add(chunks=1, frames=n)
                if progress is not None:
                    progress(done, total, stats.segments)
                if cancelled():
                    writer.abort()
                    return True
            if window is not None:
                window[1].record()
        writer.flush()
        if window is not None:
            window[1].synchronize()
            stats.add(window_s=window[0].elapsed_time(window[1]) / 1e3)
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
    try:
        chunks = _decoded_chunks(decoder, latents)
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
            rgb_to_yuv420(host, planes)
            t3 = time.perf_counter()
            stats.add(decode_s=t1 - t0, d2h_s=t2 - t1, postprocess_s=t3 - t2, chunks=1, frames=n)
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
        if progress is not None:
            progress(done, total, stats.segments)
        return False
    except BaseException:
        segmenter.abort()
        raise
