"""The ring of staging slots between the compute stream and the writer.

Each slot owns, allocated once per job (nothing per chunk on the hot path):
- ``host``: the yuv420p planes of one chunk on the host (pinned on CUDA, so the D2H copy is a
  real asynchronous DMA);
- ``staging``: the same planes on the GPU, written by the post-process on the compute stream
  (None on the CPU path, where the post-process writes ``host`` directly);
- CUDA events: ``start`` / ``decoded`` / ``processed`` on the compute stream for timing, and
  ``copied`` on the copy stream, which the writer waits on.

A slot goes back to the free list only when the writer calls ``release``: the main thread can
never overwrite staging or host memory that a copy or the encoder still reads.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from worker.pipeline.postprocess import yuv420_shape


@dataclass
class Slot:
    index: int
    host: torch.Tensor
    staging: torch.Tensor | None
    start: Any = None
    decoded: Any = None
    processed: Any = None
    copied: Any = None
    first_frame: int = 0
    frames: int = 0


class HostChunk:
    """One chunk on its way to the host (vLLM's AsyncOutput shape): the slot that holds it and
    one blocking ``wait``. The GPU staging tensor stays referenced by the slot until released."""

    def __init__(self, slot: Slot) -> None:
        self.slot = slot

    @property
    def first_frame(self) -> int:
        return self.slot.first_frame

    @property
    def frames(self) -> int:
        return self.slot.frames

    def wait(self) -> torch.Tensor:
        """Block until the planes are on the host; return them (frames, H*3/2, W)."""
        if self.slot.copied is not None:
            # A blocking event: the thread sleeps in the driver instead of spinning.
            self.slot.copied.synchronize()
        return self.slot.host[: self.slot.frames]


class Ring:
    """N preallocated slots; ``acquire`` blocks while all are in flight (back-pressure)."""

    def __init__(
        self, slots: int, max_frames: int, height: int, width: int, device: torch.device
    ) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        shape = yuv420_shape(max_frames, height, width)
        self.slots: list[Slot] = []
        self._free: queue.Queue[int] = queue.Queue()
        for i in range(slots):
            host = torch.empty(shape, dtype=torch.uint8, pin_memory=self.cuda)
            slot = Slot(i, host, None)
            if self.cuda:
                slot.staging = torch.empty(shape, dtype=torch.uint8, device=device)
                slot.start = torch.cuda.Event(enable_timing=True)
                slot.decoded = torch.cuda.Event(enable_timing=True)
                slot.processed = torch.cuda.Event(enable_timing=True)
                slot.copied = torch.cuda.Event(enable_timing=True, blocking=True)
            self.slots.append(slot)
            self._free.put(i)

    def acquire(self, check: Callable[[], None], poll_s: float = 0.05) -> tuple[Slot, float]:
        """A free slot and the seconds waited for it; ``check`` raises if the writer failed."""
        t0 = time.perf_counter()
        while True:
            check()
            try:
                index = self._free.get(timeout=poll_s)
            except queue.Empty:
                continue
            return self.slots[index], time.perf_counter() - t0

    def release(self, slot: Slot) -> None:
        self._free.put(slot.index)
