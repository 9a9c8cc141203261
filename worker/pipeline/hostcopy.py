"""The device-to-host copy of one ring slot's planes, on the copy stream (CUDA only).

The shape of vLLM's ``AsyncOutput``: the object holds the GPU tensor, issues the copy on a
side stream, records an event behind it and offers one blocking ``wait``. Unlike vLLM's, it is
allocated once per ring slot and reused for every chunk the slot carries, so the hot path
allocates neither memory nor events.

Stream assumptions, in the order a chunk goes through them:

1. ``mark_start`` / ``mark_decoded`` / ``issue`` are called on the main thread while the
   compute stream is the current stream: the events they record there order after the decode
   and post-process kernels the main thread queued on it before.
2. ``issue`` makes the copy stream wait for the ``processed`` event, so the copy starts only
   once the post-process has written ``staging``. ``staging`` belongs to the slot (not to the
   caching allocator), so no later allocation on either stream can reuse it under the copy.
3. ``copied`` is recorded on the copy stream right behind the copy; ``wait`` (writer thread)
   blocks on it. It is a blocking event: the thread sleeps in the driver instead of spinning.
4. The ring hands the slot out again only after the writer released it, i.e. after ``wait``:
   the next ``issue`` can never overwrite ``host`` or ``staging`` that are still being read.
"""

from __future__ import annotations

import torch

#: Stage seconds of one chunk as the GPU measured them (keys are PipelineStats fields).
ChunkSeconds = dict[str, float]


class HostCopy:
    """One slot's GPU staging planes, their pinned host twin and the copy between them."""

    def __init__(self, shape: tuple[int, int, int], device: torch.device,
                 stream: torch.cuda.Stream) -> None:
        """``shape``: the planes buffer (frames, H*3/2, W) uint8; ``stream``: the copy stream."""
        # Pinned, so that the copy is a real asynchronous DMA and not a staged memcpy.
        self.host = torch.empty(shape, dtype=torch.uint8, pin_memory=True)
        #: Written by the post-process on the compute stream; read by the copy.
        self.staging = torch.empty(shape, dtype=torch.uint8, device=device)
        #: The chunk's count of NaN or infinite values, on the GPU and its pinned twin:
        #: copied behind the planes, read by the writer after ``wait``.
        self.bad = torch.zeros(1, dtype=torch.int32, device=device)
        self.bad_host = torch.zeros(1, dtype=torch.int32, pin_memory=True)
        self._stream = stream
        self._start = torch.cuda.Event(enable_timing=True)
        self._decoded = torch.cuda.Event(enable_timing=True)
        self._processed = torch.cuda.Event(enable_timing=True)
        self._copied = torch.cuda.Event(enable_timing=True, blocking=True)
        self._frames = 0

    def mark_start(self) -> None:
        """On the compute stream: the chunk's decode begins after this point."""
        self._start.record()

    def mark_decoded(self) -> None:
        """On the compute stream: decode done, post-process into ``staging`` comes next."""
        self._decoded.record()

    def issue(self, frames: int) -> None:
        """Copy ``staging[:frames]`` to ``host`` on the copy stream, behind the compute stream's
        work so far (the post-process), and record ``copied`` behind it. Never blocks."""
        self._frames = frames
        self._processed.record()  # on the current (compute) stream
        self._stream.wait_event(self._processed)
        with torch.cuda.stream(self._stream):
            self.host[:frames].copy_(self.staging[:frames], non_blocking=True)
            self.bad_host.copy_(self.bad, non_blocking=True)
            self._copied.record()

    def wait(self) -> torch.Tensor:
        """Block until the copy is done; the planes on the host (frames, H*3/2, W) uint8."""
        self._copied.synchronize()
        return self.host[: self._frames]

    def seconds(self) -> ChunkSeconds:
        """Decode, post-process, copy and compute-busy seconds of the last chunk; valid only
        after ``wait`` (``copied`` is the last event, so every earlier one has completed)."""
        return {
            "decode_s": self._start.elapsed_time(self._decoded) / 1e3,
            "postprocess_s": self._decoded.elapsed_time(self._processed) / 1e3,
            "d2h_s": self._processed.elapsed_time(self._copied) / 1e3,
            "busy_s": self._start.elapsed_time(self._processed) / 1e3,
        }
