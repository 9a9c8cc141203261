"""Cutting the frame stream into MP4 segments, each encoded and handed to the sink.

``Segmenter.add`` takes frames in global order; where each segment starts is planned up front
(``segment_starts``). In threaded mode each segment gets its own encoder thread (segments are
independent files, so segment k finishes while k+1 fills); at most ``max_in_flight`` segments
encode at once, the oldest is awaited first. In inline mode (the sequential baseline) encoding
and the sink run on the caller's thread.

The job's tail: whatever the encoder still has to do once the last chunk is decoded is time
the GPU is paid for and idle. That is the last chunk's frames, encoded one after the other by
the last segment's encoder. ``tail_parts`` > 1 gives those frames segments of their own,
opened (codec and all) while earlier chunks decode, so they encode side by side.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import av

from producer.wire.spec import VideoSpec, segment_name
from worker.pipeline.encode import EncodedFile, SegmentEncoder
from worker.pipeline.stats import PipelineStats
from worker.pipeline.threads import QueueThread


@dataclass(frozen=True)
class ClosedSegment:
    index: int
    first_frame: int
    file: EncodedFile
    #: The job's last segment by index (the sink may see it before earlier ones land).
    last: bool = False


def segment_starts(total: int, video: VideoSpec, tail: tuple[int, int] | None = None
                   ) -> list[int]:
    """First frame of every segment of a ``total``-frame job: ``first_segment_frames`` for the
    first (when set), ``segment_frames`` for the others. ``tail=(start, parts)``: frames from
    ``start`` on get ``parts`` (near) equal segments of their own (no effect for ``parts`` 1,
    ``start`` 0 or a ``start`` past the end)."""
    starts, frame = [], 0
    size = video.first_segment_frames or video.segment_frames
    while frame < total:
        starts.append(frame)
        frame += size
        size = video.segment_frames
    if tail is None:
        return starts
    start, parts = tail
    parts = min(parts, total - start)
    if parts <= 1 or start <= 0:
        return starts
    head = [f for f in starts if f < start]
    return head + [start + (total - start) * i // parts for i in range(parts)]


#: Receives each finished segment file (e.g. uploads it). Runs on an encoder thread.
SegmentSink = Callable[[ClosedSegment], None]

_END = None  # the end marker of a segment's frame queue


class _SegmentJob:
    """One segment: frames in, encoded file out, then the sink."""

    def __init__(
        self, index: int, first_frame: int, frames: int, path: Path, size: tuple[int, int],
        video: VideoSpec, sink: SegmentSink, stats: PipelineStats, last: bool,
    ) -> None:
        self.index = index
        self.first_frame = first_frame
        self.frames = frames  # planned
        self.last = last
        self.count = 0
        self._encoder = SegmentEncoder(path, size[1], size[0], video, first_frame)
        self._sink = sink
        self._stats = stats

    def open(self) -> None:
        """Open the codec now (libx264 starts its threads) rather than at the first frame."""
        t0 = time.perf_counter()
        self._encoder.stream.codec_context.open()
        self._stats.add(encode_s=time.perf_counter() - t0)

    def encode(self, frame: av.VideoFrame) -> None:
        t0 = time.perf_counter()
        self._encoder.add(frame)
        self._stats.add(encode_s=time.perf_counter() - t0)

    def finish(self) -> None:
        t0 = time.perf_counter()
        encoded = self._encoder.close()
        self._stats.add(encode_s=time.perf_counter() - t0)
        t0 = time.perf_counter()
        self._sink(ClosedSegment(self.index, self.first_frame, encoded, self.last))
        self._stats.add(upload_s=time.perf_counter() - t0, segments=1)

    def abort(self) -> None:
        self._encoder.abort()


class _SegmentThread(QueueThread[av.VideoFrame]):
    """Encodes one segment's frames as they arrive, then hands the file to the sink."""

    def __init__(self, job: _SegmentJob, stop: threading.Event, depth: int,
                 open_now: bool = False) -> None:
        super().__init__(f"encode-{job.index}", depth, stop)
        self.job = job
        self.open_now = open_now

    def run(self) -> None:
        if self.open_now:
            try:
                self.job.open()
            except BaseException as e:  # noqa: BLE001 - forwarded to the owner
                self.error = e
                self.aborted()
                return
        super().run()

    def handle(self, item: av.VideoFrame) -> None:
        self.job.encode(item)

    def finish(self) -> None:
        self.job.finish()

    def aborted(self) -> None:
        self.job.abort()


class Segmenter:
    """Routes frames into the planned segments (``segment_starts``) and finishes them in
    order; ``tail_parts``: see the module docstring."""

    def __init__(
        self, size: tuple[int, int], video: VideoSpec, scratch: Path, sink: SegmentSink,
        stats: PipelineStats, threaded: bool, *, total: int, tail_start: int = 0,
        tail_parts: int = 1, max_in_flight: int = 2, queue_depth: int = 16,
    ) -> None:
        self.size, self.video, self.scratch, self.sink = size, video, scratch, sink
        self.stats, self.threaded = stats, threaded
        self.max_in_flight = max(1, max_in_flight)
        self.queue_depth = queue_depth
        self.total = total
        self.starts = segment_starts(total, video, (tail_start, tail_parts))
        #: Index of the first segment made of the last chunk's frames (None: no such split).
        self.tail_index: int | None = None
        if tail_parts > 1 and tail_start in self.starts[1:]:
            self.tail_index = self.starts.index(tail_start)
        self.stop = threading.Event()
        self._current: _SegmentJob | None = None
        self._thread: _SegmentThread | None = None
        self._in_flight: list[_SegmentThread] = []
        self._opened: dict[int, _SegmentThread] = {}  # opened ahead of their first frame
        self._next_index = 0
        self._frames_in = 0

    def _end(self, index: int) -> int:
        return self.starts[index + 1] if index + 1 < len(self.starts) else self.total

    def _job(self, index: int) -> _SegmentJob:
        first = self.starts[index]
        return _SegmentJob(index, first, self._end(index) - first,
                           self.scratch / segment_name(index), self.size, self.video,
                           self.sink, self.stats, last=index == len(self.starts) - 1)

    def _open(self, first_frame: int) -> None:
        index = self._next_index
        if first_frame != self.starts[index]:
            raise ValueError(f"frame {first_frame} arrived where segment {index} starts at "
                             f"{self.starts[index]}: frames must come in order")
        self._next_index += 1
        thread = self._opened.pop(index, None)
        if thread is not None:
            self._current, self._thread = thread.job, thread
            return
        job = self._job(index)
        self._current = job
        if self.threaded:
            while len(self._in_flight) >= self.max_in_flight:
                self._join(self._in_flight.pop(0))
            thread = _SegmentThread(job, self.stop, self.queue_depth)
            self._thread = thread
            thread.start()
            self._in_flight.append(thread)
            if self.tail_index == index + 1:
                self._open_tail()

    def _open_tail(self) -> None:
        """Start the tail's encoders now, past the in-flight limit (they are short): their
        codecs open while the chunks before them decode."""
        assert self.tail_index is not None
        for index in range(self.tail_index, len(self.starts)):
            thread = _SegmentThread(self._job(index), self.stop, self.queue_depth,
                                    open_now=True)
            thread.start()
            self._in_flight.append(thread)
            self._opened[index] = thread

    def _close_current(self) -> None:
        job, self._current = self._current, None
        if job is None:
            return
        if self._thread is not None:
            self._thread.put(_END)
            self._thread = None
        else:
            job.finish()

    def _join(self, thread: _SegmentThread) -> None:
        while thread.is_alive():
            thread.join(timeout=0.05)
            if self.stop.is_set():
                break
        thread.check()

    def add(self, frame: av.VideoFrame, index: int) -> None:
        if self._current is None:
            self._open(index)
        assert self._current is not None
        self._frames_in += 1
        self._current.count += 1
        if self._thread is not None:
            self._thread.put(frame)
        else:
            self._current.encode(frame)
        # Closed with its last frame, not when the next one arrives: a segment lands (and is
        # playable) one decoded chunk sooner.
        if self._current.count >= self._current.frames:
            self._close_current()

    def finish(self) -> None:
        """Close the last segment and wait until every segment went through the sink."""
        if self._current is not None or self._next_index < len(self.starts):
            # Fewer frames than the plan: a decoder bug, never a shorter video in disguise.
            done = self._frames_in
            self.abort()
            raise RuntimeError(f"pipeline: {done} of {self.total} frames arrived")
        while self._in_flight:
            self._join(self._in_flight.pop(0))

    def abort(self) -> None:
        """Stop every encoder and delete unfinished files; safe to call more than once."""
        self.stop.set()
        for thread in self._in_flight:
            thread.join(timeout=5.0)
        if self._current is not None and self._thread is None:
            self._current.abort()
        self._in_flight.clear()
        self._opened.clear()
