"""Cutting the frame stream into MP4 segments, each encoded and handed to the sink.

``Segmenter.add`` takes frames in global order. In threaded mode each segment gets its own
encoder thread (segments are independent files, so segment k finishes while k+1 fills); at most
``max_in_flight`` segments encode at once, the oldest is awaited first. In inline mode
(the sequential baseline) encoding and the sink run on the caller's thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import av

from producer.spec import VideoSpec, segment_name
from worker.pipeline.encode import EncodedFile, SegmentEncoder
from worker.pipeline.stats import PipelineStats
from worker.pipeline.threads import QueueThread


@dataclass(frozen=True)
class ClosedSegment:
    index: int
    first_frame: int
    file: EncodedFile


#: Receives each finished segment file (e.g. uploads it). Runs on an encoder thread.
SegmentSink = Callable[[ClosedSegment], None]

_END = None  # the end marker of a segment's frame queue


class _SegmentJob:
    """One segment: frames in, encoded file out, then the sink."""

    def __init__(
        self, index: int, first_frame: int, path: Path, size: tuple[int, int],
        video: VideoSpec, sink: SegmentSink, stats: PipelineStats,
    ) -> None:
        self.index = index
        self.first_frame = first_frame
        self.count = 0
        self._encoder = SegmentEncoder(path, size[1], size[0], video, first_frame)
        self._sink = sink
        self._stats = stats

    def encode(self, frame: av.VideoFrame) -> None:
        t0 = time.perf_counter()
        self._encoder.add(frame)
        self._stats.add(encode_s=time.perf_counter() - t0)

    def finish(self) -> None:
        t0 = time.perf_counter()
        encoded = self._encoder.close()
        self._stats.add(encode_s=time.perf_counter() - t0)
        t0 = time.perf_counter()
        self._sink(ClosedSegment(self.index, self.first_frame, encoded))
        self._stats.add(upload_s=time.perf_counter() - t0, segments=1)

    def abort(self) -> None:
        self._encoder.abort()


class _SegmentThread(QueueThread[av.VideoFrame]):
    """Encodes one segment's frames as they arrive, then hands the file to the sink."""

    def __init__(self, job: _SegmentJob, stop: threading.Event, depth: int) -> None:
        super().__init__(f"encode-{job.index}", depth, stop)
        self.job = job

    def handle(self, item: av.VideoFrame) -> None:
        self.job.encode(item)

    def finish(self) -> None:
        self.job.finish()

    def aborted(self) -> None:
        self.job.abort()


class Segmenter:
    """Routes frames into segments of ``video.segment_frames`` (the first one of
    ``video.first_segment_frames`` when set) and finishes them in order."""

    def __init__(
        self, size: tuple[int, int], video: VideoSpec, scratch: Path, sink: SegmentSink,
        stats: PipelineStats, threaded: bool, max_in_flight: int = 2, queue_depth: int = 16,
    ) -> None:
        self.size, self.video, self.scratch, self.sink = size, video, scratch, sink
        self.stats, self.threaded = stats, threaded
        self.max_in_flight = max(1, max_in_flight)
        self.queue_depth = queue_depth
        self.stop = threading.Event()
        self._current: _SegmentJob | None = None
        self._thread: _SegmentThread | None = None
        self._in_flight: list[_SegmentThread] = []
        self._next_index = 0

    def _open(self, first_frame: int) -> None:
        path = self.scratch / segment_name(self._next_index)
        job = _SegmentJob(
            self._next_index, first_frame, path, self.size, self.video, self.sink, self.stats
        )
        self._next_index += 1
        self._current = job
        if self.threaded:
            while len(self._in_flight) >= self.max_in_flight:
                self._join(self._in_flight.pop(0))
            self._thread = _SegmentThread(job, self.stop, self.queue_depth)
            self._thread.start()
            self._in_flight.append(self._thread)

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

    def _limit(self, job: _SegmentJob) -> int:
        """Frames in ``job``'s segment: ``first_segment_frames`` for the first (a fast first
        playable segment), ``segment_frames`` for the others."""
        first = self.video.first_segment_frames
        return first if job.index == 0 and first is not None else self.video.segment_frames

    def add(self, frame: av.VideoFrame, index: int) -> None:
        if self._current is None:
            self._open(index)
        assert self._current is not None
        self._current.count += 1
        if self._thread is not None:
            self._thread.put(frame)
        else:
            self._current.encode(frame)
        # Closed with its last frame, not when the next one arrives: a segment lands (and is
        # playable) one decoded chunk sooner.
        if self._current.count >= self._limit(self._current):
            self._close_current()

    def finish(self) -> None:
        """Close the last segment and wait until every segment went through the sink."""
        self._close_current()
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
