"""The live HLS stream of a job: ``index.m3u8``, an EVENT playlist of its fMP4 segments.

Each segment file (see worker/pipeline/encode.py) is listed with byte ranges into itself: its
``ftyp``+``moov`` part is the segment's ``EXT-X-MAP`` (init section) and the ``moof``/``mdat``
rest is the media segment, so nothing is written twice and every listed byte is covered by
the segment's sha256 in the manifest. Every segment gets its own map (each one comes out of
its own encoder, so one shared init section would be a promise the encoders never made).

Rules the playlist keeps:

- ``EXT-X-PLAYLIST-TYPE:EVENT``: segments are only ever appended; ``EXT-X-ENDLIST`` is added
  once every segment landed, before ``manifest.json`` (still the completion marker). A job
  that ends without its video (cancelled, or failed for good) ends its playlist too, at the
  segments it listed (:meth:`LivePlaylist.end_early`): players stop polling a stream that
  will never grow, and the missing ``manifest.json`` still says the output is incomplete.
- Every version is uploaded with ``Cache-Control: no-cache``: a CDN or browser in front of
  the bucket revalidates it on each poll instead of serving a stale live edge.
- Only a contiguous prefix 0..k is listed: encoders finish out of order (segment k+1 may land
  before k), and a player must never see a gap it would have to skip.
- ``EXT-X-TARGETDURATION`` is fixed from the spec (the longest segment it allows, rounded
  up), since it must not change while the playlist lives.
- ``EXT-X-START:TIME-OFFSET=0``: a player that opens the stream mid-job starts at the first
  frame, not at the live edge.
- Uploads are serialised, so an older version of the playlist never lands over a newer one.
- What a player saw listed stays listed, across retries too. The playlist names the spec it
  belongs to (a ``# framefleet-spec <digest>`` comment line, which players ignore); a retry
  of that spec that finds it open (:meth:`LivePlaylist.resume`) keeps its entries: a segment
  it lists is not uploaded again but read back and taken as it is (:meth:`LivePlaylist.reuse`,
  its size must match the listing), and every upload still lists at least those entries. A
  re-encoded segment could differ by a byte (GPU kernels are not bit-reproducible), and the
  byte ranges a player already holds would then point into the wrong file.
- A run that did not write the playlist can still end it (:func:`end_stored`): a job failed
  for good before its run decoded anything (the poison cap, say) ends the playlist an
  earlier run left open, as it is stored, and only one of its own spec.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass

from producer.errors import InputNotFoundError, InvalidJobError, StorageConfigError
from producer.wire.spec import SegmentInfo, VideoSpec, segment_name
from worker.pipeline.encode import frame_rate
from worker.stores.storage import JobOutput

PLAYLIST = "index.m3u8"
CONTENT_TYPE = "application/vnd.apple.mpegurl"
CACHE_CONTROL = "no-cache"
#: EXT-X-MAP in a media playlist without I-frames needs 6; 7 is the fMP4 baseline players
#: expect (hls.js, AVPlayer).
VERSION = 7
SPEC_MARK = "# framefleet-spec "
#: Bound of the read of a playlist a retry finds (thousands of entries fit).
MAX_PLAYLIST_BYTES = 4 * 1024**2
_ENTRY = re.compile(r'#EXT-X-MAP:URI="([^"\n]+)",BYTERANGE="(\d+)@0"\n#EXTINF:([0-9.]+),\n'
                    r"#EXT-X-BYTERANGE:(\d+)@(\d+)\n([^\n]+)\n")


@dataclass(frozen=True)
class Entry:
    """One listed segment: its file, the size of its init part, its total size, seconds."""

    name: str
    init_bytes: int
    bytes: int
    seconds: float


def listed_entries(text: str, digest: str) -> list[Entry]:
    """The entries of an open playlist written for the spec ``digest`` (else none)."""
    if f"\n{SPEC_MARK}{digest}\n" not in text or "#EXT-X-ENDLIST" in text:
        return []
    entries: list[Entry] = []
    for m in _ENTRY.finditer(text):
        name, init, media, offset = m[1], int(m[2]), int(m[4]), int(m[5])
        if name != m[6] or offset != init or name != segment_name(len(entries)):
            break  # not a listing this module wrote: keep what came before
        entries.append(Entry(name, init, init + media, float(m[3])))
    return entries


def end_stored(out: JobOutput, digest: str) -> str | None:
    """Add ``EXT-X-ENDLIST`` to the stored playlist of the spec ``digest``, keeping what it
    lists; returns its URI, or None when there is none, it names another spec, or it is
    ended already (never a second ENDLIST)."""
    if not out.exists(PLAYLIST):
        return None
    try:
        text = out.get_bytes(PLAYLIST, MAX_PLAYLIST_BYTES).decode("utf-8", "replace")
    except (InputNotFoundError, InvalidJobError):  # gone meanwhile, or too large to be ours
        return None
    if f"\n{SPEC_MARK}{digest}\n" not in text or "#EXT-X-ENDLIST" in text:
        return None
    if not text.endswith("\n"):
        text += "\n"
    out.put_bytes(PLAYLIST, (text + "#EXT-X-ENDLIST\n").encode(), CONTENT_TYPE, CACHE_CONTROL)
    return out.uri(PLAYLIST)


def target_duration(video: VideoSpec) -> int:
    """Whole seconds no segment of ``video`` exceeds (EXT-X-TARGETDURATION)."""
    longest = max(video.segment_frames, video.first_segment_frames or 0)
    return max(1, math.ceil(longest / frame_rate(video.fps)))


def _name(uri: str) -> str:
    """A segment's URI relative to the playlist (its file name: they share a folder)."""
    return uri.rsplit("/", 1)[-1]


class LivePlaylist:
    """Builds and uploads ``index.m3u8`` as segments land; thread-safe.

    ``on_listed(seg)`` is called for each segment when it joins the playlist, in index order,
    after the playlist that lists it was uploaded.
    """

    def __init__(
        self, out: JobOutput, video: VideoSpec,
        on_listed: Callable[[SegmentInfo], None] = lambda seg: None, digest: str = "",
    ) -> None:
        self.out = out
        self.video = video
        self.on_listed = on_listed
        self.digest = digest
        self._rate = frame_rate(video.fps)
        self._kept: list[Entry] = []  # what an earlier run of the spec listed
        self._landed: dict[int, tuple[SegmentInfo, int]] = {}
        self._listed = 0  # segments 0 .. _listed-1 are in the uploaded playlist
        self._ended = False
        self._lock = threading.Lock()

    @property
    def uri(self) -> str:
        return self.out.uri(PLAYLIST)

    def resume(self) -> int:
        """Keep what an earlier run of this spec listed in a playlist it left open; returns
        the number of entries kept. Call before the first segment lands."""
        if not self.digest or not self.out.exists(PLAYLIST):
            return 0
        try:
            data = self.out.get_bytes(PLAYLIST, MAX_PLAYLIST_BYTES)
        except (InputNotFoundError, InvalidJobError):  # gone meanwhile, or not ours: start anew
            return 0
        self._kept = listed_entries(data.decode("utf-8", "replace"), self.digest)
        return len(self._kept)

    def reuse(self, index: int, max_bytes: int) -> tuple[bytes, int] | None:
        """The stored file of kept segment ``index`` and the size of its init part, read
        back; None when the segment was not kept, is over ``max_bytes``, or its file is not
        what was listed (then it is uploaded anew)."""
        if index >= len(self._kept):
            return None
        entry = self._kept[index]
        if entry.bytes > max_bytes:
            return None
        try:
            data = self.out.get_bytes(entry.name, entry.bytes)
        except (InputNotFoundError, InvalidJobError, StorageConfigError):
            # Missing (S3 says 403 for that without ListBucket), or larger than listed: upload
            # anew (a real configuration error then fails that upload).
            return None
        return (data, entry.init_bytes) if len(data) == entry.bytes else None

    def landed(self, seg: SegmentInfo, init_bytes: int) -> None:
        """Segment ``seg`` is stored; ``init_bytes`` is the size of its init part."""
        if not 0 < init_bytes < seg.bytes:
            raise ValueError(f"segment {seg.index}: init part of {init_bytes} bytes out of range")
        with self._lock:
            if self._ended:
                raise RuntimeError(f"{PLAYLIST} already ended; segment {seg.index} came late")
            self._landed[seg.index] = (seg, init_bytes)
            before = self._listed
            while self._listed in self._landed:
                self._listed += 1
            if self._listed == before:
                return  # an earlier segment is still encoding: list nothing yet
            self._upload()
            for index in range(before, self._listed):
                self.on_listed(self._landed[index][0])

    def finish(self) -> str:
        """Add ``EXT-X-ENDLIST`` (every segment landed); returns the playlist's URI."""
        with self._lock:
            if len(self._landed) != self._listed:
                missing = sorted(set(range(max(self._landed, default=-1) + 1)) - set(self._landed))
                raise RuntimeError(f"{PLAYLIST}: segments {missing} never landed")
            self._ended = True
            self._upload()
        return self.uri

    def end_early(self) -> str | None:
        """End the playlist at the segments listed so far (the job ends without the rest);
        returns its URI, or None when it was never uploaded or is already ended."""
        with self._lock:
            if self._ended or not self._entries():
                return None
            self._ended = True
            self._upload()
        return self.uri

    def _upload(self) -> None:
        self.out.put_bytes(PLAYLIST, self.render().encode(), CONTENT_TYPE, CACHE_CONTROL)

    def render(self) -> str:
        """The playlist text for the segments listed so far."""
        lines = [
            "#EXTM3U",
            *([f"{SPEC_MARK}{self.digest}"] if self.digest else []),
            f"#EXT-X-VERSION:{VERSION}",
            f"#EXT-X-TARGETDURATION:{target_duration(self.video)}",
            "#EXT-X-PLAYLIST-TYPE:EVENT",
            "#EXT-X-MEDIA-SEQUENCE:0",
            "#EXT-X-INDEPENDENT-SEGMENTS",
            "#EXT-X-START:TIME-OFFSET=0,PRECISE=YES",
        ]
        for entry in self._entries():
            lines += [
                f'#EXT-X-MAP:URI="{entry.name}",BYTERANGE="{entry.init_bytes}@0"',
                f"#EXTINF:{entry.seconds:.6f},",
                f"#EXT-X-BYTERANGE:{entry.bytes - entry.init_bytes}@{entry.init_bytes}",
                entry.name,
            ]
        if self._ended:
            lines.append("#EXT-X-ENDLIST")
        return "\n".join(lines) + "\n"

    def _entries(self) -> list[Entry]:
        """The listed prefix, then what an earlier run listed beyond it (never fewer)."""
        entries = []
        for index in range(self._listed):
            seg, init = self._landed[index]
            entries.append(Entry(_name(seg.uri), init, seg.bytes, float(seg.frames / self._rate)))
        return entries + self._kept[self._listed:]
