"""Where a run's finished segments go: the store, the live playlist, the run's segment hooks.

The pipeline hands each closed segment to ``SegmentPublisher.__call__`` on the thread that
encoded it. The publisher uploads it (or keeps the copy an earlier run of the same spec listed:
a player may hold byte ranges into it), lists it in the live HLS playlist, which announces
segments in index order only (encoders finish out of order), and each announcement reaches the
run's segment hooks (webhooks). A new sink (another store, a CDN purge) is a change here only.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from pathlib import Path

from producer.wire.spec import Progress, SegmentInfo, segment_name
from worker.pipeline import ClosedSegment
from worker.pipeline.encode import concat_segments
from worker.run.run import Run
from worker.sinks.hls import LivePlaylist
from worker.stores.storage import JobOutput

log = logging.getLogger(__name__)


class SegmentPublisher:
    """Uploads and lists one run's segments; opens the job's live playlist on creation."""

    def __init__(self, run: Run, out: JobOutput, frames_total: int) -> None:
        self.run, self.out, self.frames_total = run, out, frames_total
        spec = run.spec
        self.fps = spec.video.fps
        self._segments: list[SegmentInfo] = []
        self._lock = threading.Lock()  # segments close on several encoder threads
        self.playlist = LivePlaylist(out, spec.video, on_listed=self._listed,
                                     digest=spec.digest())
        run.playlist = self.playlist  # a concern may end it early (cancel, failure)
        kept = self.playlist.resume()
        if kept:
            log.info("job %s: the live playlist lists %d segments already: they are kept",
                     spec.job_id, kept)

    def __call__(self, seg: ClosedSegment) -> None:
        """The pipeline's sink: store ``seg`` and list it."""
        name = segment_name(seg.index)
        init, size, sha256 = seg.file.init_bytes, seg.file.bytes, seg.file.sha256
        # A segment a player may have seen (listed by an earlier run) is kept as stored.
        stored = self.playlist.reuse(seg.index, max_bytes=4 * size + 2**20)
        if stored is None:
            uri = self.out.put_file(name, seg.file.path)
        else:
            data, init = stored
            seg.file.path.write_bytes(data)  # what full.mp4 is stitched from
            uri, size, sha256 = self.out.uri(name), len(data), hashlib.sha256(data).hexdigest()
        info = SegmentInfo(
            index=seg.index, uri=uri, first_frame=seg.first_frame, frames=seg.file.frames,
            bytes=size, sha256=sha256, seconds=seg.file.frames / self.fps,
        )
        with self._lock:
            self._segments.append(info)
        self.playlist.landed(info, init)

    def _listed(self, seg: SegmentInfo) -> None:
        self.run.segment_landed(seg, Progress(
            frames_done=seg.first_frame + seg.frames, frames_total=self.frames_total,
            segments_done=seg.index + 1))

    @property
    def segments(self) -> list[SegmentInfo]:
        """The segments stored so far, in index order."""
        with self._lock:
            return sorted(self._segments, key=lambda s: s.index)

    def stitch(self, scratch: Path) -> str:
        """``full.mp4``: every segment (their files in ``scratch``) in one MP4; its URI."""
        parts = [scratch / segment_name(s.index) for s in self.segments]
        full = concat_segments(parts, scratch / "f.mp4")
        return self.out.put_file("full.mp4", full.path)

    def finish(self) -> str:
        """End the playlist (``EXT-X-ENDLIST``): every segment is listed. Its URI."""
        return self.playlist.finish()
