"""The ring of staging slots between the main thread and the writer.

Each slot owns, allocated once per job (nothing per chunk on the hot path), the yuv420p planes
of one chunk on the host. On CUDA a :class:`HostCopy` owns them, together with their GPU
staging twin and the copy between the two; on the CPU the post-process writes them directly.

A slot goes back to the free list only when the writer calls ``release``: the main thread can
never overwrite staging or host memory that a copy or the encoder still reads.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from worker.pipeline.hostcopy import HostCopy
from worker.pipeline.postprocess import yuv420_shape


@dataclass
class Slot:
    index: int
    host: torch.Tensor
    #: CUDA: the copy that fills ``host``; None on the CPU, where ``host`` is written directly.
    copy: HostCopy | None = None
    first_frame: int = 0
    frames: int = 0
    #: CPU: the chunk's count of NaN or infinite values (on CUDA the copy carries its own).
    bad: torch.Tensor = field(default_factory=lambda: torch.zeros(1, dtype=torch.int32))

    def wait(self) -> torch.Tensor:
        """Block until this chunk's planes are on the host; return them (frames, H*3/2, W)."""
        if self.copy is not None:
            return self.copy.wait()
        return self.host[: self.frames]

    def nonfinite(self) -> int:
        """NaN or infinite values the chunk had before its post-process; after ``wait``."""
        return int((self.copy.bad_host if self.copy is not None else self.bad)[0])


class Ring:
    """N preallocated slots; ``acquire`` blocks while all are in flight (back-pressure)."""

    def __init__(
        self, slots: int, max_frames: int, height: int, width: int, device: torch.device,
        copy_stream: torch.cuda.Stream | None = None,
    ) -> None:
        """On CUDA, ``copy_stream`` is the stream every slot's device-to-host copy runs on."""
        shape = yuv420_shape(max_frames, height, width)
        self.slots: list[Slot] = []
        self._free: queue.Queue[int] = queue.Queue()
        for i in range(slots):
            if device.type == "cuda":
                if copy_stream is None:
                    raise ValueError("a CUDA ring needs the copy stream")
                copy = HostCopy(shape, device, copy_stream)
                self.slots.append(Slot(i, copy.host, copy))
            else:
                self.slots.append(Slot(i, torch.empty(shape, dtype=torch.uint8)))
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
