"""What the main thread of the ``async`` mode does per chunk, on CUDA and on the CPU.

Both paths fill one ring slot per chunk with the chunk's yuv420p planes and return its frame
count (None once the decoder is exhausted); the engine's loop around them is device-free.

- :class:`CudaLaunch` only queues work and never blocks: decode and post-process on the
  compute stream into the slot's GPU staging, then the slot's :class:`HostCopy` issues the
  copy to the pinned host buffer on the copy stream. The writer waits for it.
- :class:`CpuLaunch` has no streams: it decodes and post-processes straight into the slot's
  host buffer, timing both on the CPU clock; decoding still overlaps encoding and upload
  through the writer thread.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator
from typing import Protocol

import torch

from worker.pipeline.postprocess import rgb_to_yuv420
from worker.pipeline.ring import Slot
from worker.pipeline.stats import PipelineStats


@functools.cache
def cuda_streams(device: torch.device) -> tuple[torch.cuda.Stream, torch.cuda.Stream]:
    """(compute, copy) streams of ``device``, created once per worker process.

    The caching allocator keeps freed blocks per stream: new streams for every job would
    strand the previous job's cached working set and cudaMalloc a fresh one.
    """
    return torch.cuda.Stream(device), torch.cuda.Stream(device)


class Launch(Protocol):
    def active(self) -> contextlib.AbstractContextManager[None]:
        """The context the whole decode loop runs in."""
        ...

    def fill(self, slot: Slot, chunks: Iterator[torch.Tensor]) -> int | None:
        """Decode the next chunk into ``slot``; its frame count, or None at the end."""
        ...

    def window_s(self) -> float:
        """Seconds of the decode window (for the GPU busy ratio); 0.0 when not measured.
        Call after the writer flushed."""
        ...


class CudaLaunch:
    """Decode and post-process on the compute stream, copy on the copy stream."""

    def __init__(self, compute: torch.cuda.Stream) -> None:
        self.compute = compute
        self._begin = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        # The compute stream is current for the whole loop: the decoder queues its kernels on
        # the current stream, and so do the post-process and the slot events below.
        with torch.cuda.stream(self.compute):
            self._begin.record()
            try:
                yield
            finally:
                self._end.record()

    def fill(self, slot: Slot, chunks: Iterator[torch.Tensor]) -> int | None:
        copy = slot.copy
        assert copy is not None, "a CUDA ring slot carries its HostCopy"
        copy.mark_start()
        chunk = next(chunks, None)
        if chunk is None:
            return None
        n = chunk.shape[1]
        copy.mark_decoded()
        rgb_to_yuv420(chunk, copy.staging[:n], copy.bad)
        # ``chunk`` is freed when this returns, while the post-process may still read it: the
        # allocator hands its block out again only to work queued later on the same (compute)
        # stream, so the reuse is ordered behind this kernel.
        copy.issue(n)
        return n

    def window_s(self) -> float:
        self._end.synchronize()
        return self._begin.elapsed_time(self._end) / 1e3


class CpuLaunch:
    """Decode and post-process into the slot's host buffer on this thread."""

    def __init__(self, stats: PipelineStats) -> None:
        self.stats = stats

    def active(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def fill(self, slot: Slot, chunks: Iterator[torch.Tensor]) -> int | None:
        t0 = time.perf_counter()
        chunk = next(chunks, None)
        if chunk is None:
            return None
        n = chunk.shape[1]
        t1 = time.perf_counter()
        rgb_to_yuv420(chunk, slot.host[:n], slot.bad)
        self.stats.add(decode_s=t1 - t0, postprocess_s=time.perf_counter() - t1)
        return n

    def window_s(self) -> float:
        return 0.0
