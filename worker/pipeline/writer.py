"""The writer thread: takes chunks in order, waits for their planes, feeds the segmenter.

Keeps every codec and upload call off the main thread (the main thread only launches kernels
and copies). Each chunk's frames are copied into AVFrames, then its ring slot is released: the
slot is never reused while the writer still reads it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from producer.errors import NonFiniteOutput
from worker.pipeline.encode import yuv_frame
from worker.pipeline.ring import Ring, Slot
from worker.pipeline.segments import Segmenter
from worker.pipeline.stats import PipelineStats
from worker.pipeline.threads import QueueThread

_END = None
#: Sees (first_frame, host planes (n, H*3/2, W) uint8) of every chunk before it is encoded.
FrameTap = Callable[[int, torch.Tensor], None]


def check_finite(bad: int, first: int, frames: int) -> None:
    """Refuse a chunk that had ``bad`` NaN or infinite values, before any of it is encoded."""
    if bad:
        raise NonFiniteOutput(f"decode: {bad} NaN or infinite values in frames {first}-"
                              f"{first + frames - 1}; not encoded")


class Writer(QueueThread[Slot]):
    def __init__(
        self, ring: Ring, segmenter: Segmenter, stats: PipelineStats, tap: FrameTap | None = None
    ) -> None:
        super().__init__("framefleet-writer", depth=len(ring.slots))
        self.ring = ring
        self.segmenter = segmenter
        self.stats = stats
        self.tap = tap
        self._planes_at = time.perf_counter()  # when the latest chunk's planes were on the host

    def handle(self, item: Slot) -> None:
        self._write(item)

    def finish(self) -> None:
        self.segmenter.finish()
        self.stats.add(tail_s=time.perf_counter() - self._planes_at)

    def aborted(self) -> None:
        self.segmenter.abort()

    def _write(self, slot: Slot) -> None:
        planes = slot.wait()
        self._planes_at = time.perf_counter()
        check_finite(slot.nonfinite(), slot.first_frame, slot.frames)
        if slot.copy is not None:
            self.stats.add(**slot.copy.seconds())
        if self.tap is not None:
            self.tap(slot.first_frame, planes)
        frames = [yuv_frame(planes[j].numpy()) for j in range(slot.frames)]
        first = slot.first_frame
        self.ring.release(slot)
        for j, frame in enumerate(frames):
            self.segmenter.add(frame, first + j)

    def flush(self) -> None:
        """Flush: every chunk encoded and every segment through the sink; raises its error."""
        self.put(_END)
        while self.is_alive():
            self.join(timeout=0.05)
        self.check()

    def abort(self) -> None:
        self.stop.set()
        self.segmenter.abort()
        self.join(timeout=10.0)
