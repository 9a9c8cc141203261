"""PyAV MP4 segment writer: H.264 in MP4 from yuv420p planes, tagged BT.709 limited range.

Frames arrive already in yuv420p (converted on the GPU), so no swscale runs here; libx264
releases the GIL while it encodes, so several segments encode in parallel threads.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from producer.spec import VideoSpec

# ISO/IEC 23091-2 code points: BT.709 primaries, transfer and matrix; range 1 = limited (MPEG).
BT709 = 1
LIMITED_RANGE = 1


def frame_rate(fps: float) -> Fraction:
    """A rational frame rate: 23.976 → 24000/1001, 16.0 → 16."""
    return Fraction(fps).limit_denominator(1001)


def yuv_frame(planes: np.ndarray) -> av.VideoFrame:
    """An AVFrame (copy) from one frame's stacked planes, shape (H*3/2, W) uint8."""
    frame = av.VideoFrame.from_ndarray(planes, format="yuv420p")
    frame.colorspace = BT709
    frame.color_range = LIMITED_RANGE
    return frame


@dataclass(frozen=True)
class EncodedFile:
    path: Path
    frames: int
    bytes: int
    sha256: str


class SegmentEncoder:
    """Encodes one MP4 file; ``add`` frames in order, then ``close``."""

    def __init__(self, path: Path, width: int, height: int, video: VideoSpec) -> None:
        self.path = path
        self.frames = 0
        self.container = av.open(str(path), mode="w", options={"movflags": "+faststart"})
        rate = frame_rate(video.fps)
        stream = self.container.add_stream(video.codec, rate=rate)
        stream.width, stream.height = width, height
        stream.pix_fmt = "yuv420p"
        stream.time_base = 1 / rate
        cc = stream.codec_context
        cc.color_primaries = BT709
        cc.color_trc = BT709
        cc.colorspace = BT709
        cc.color_range = LIMITED_RANGE
        if video.codec == "libx264":
            stream.options = {"crf": str(video.crf), "preset": video.preset}
            if video.tune != "none":
                stream.options = {**stream.options, "tune": video.tune}
        else:  # h264_nvenc: constant-quality mode is its CRF.
            stream.options = {"cq": str(video.crf), "preset": "p4", "rc": "vbr"}
            if video.tune == "zerolatency":
                stream.options = {**stream.options, "tune": "ll"}
        self.stream = stream

    def add(self, frame: av.VideoFrame) -> None:
        frame.pts = self.frames
        self.frames += 1
        for packet in self.stream.encode(frame):
            self.container.mux(packet)

    def close(self) -> EncodedFile:
        for packet in self.stream.encode(None):
            self.container.mux(packet)
        self.container.close()
        return EncodedFile(self.path, self.frames, self.path.stat().st_size, sha256_file(self.path))

    def abort(self) -> None:
        try:
            self.container.close()
        except Exception:  # noqa: BLE001 - already failing; the original error matters
            pass
        self.path.unlink(missing_ok=True)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def concat_segments(segments: list[Path], out: Path) -> EncodedFile:
    """Stitch MP4 segments into one file by remuxing packets (no re-encode)."""
    frames = 0
    with av.open(str(out), mode="w", options={"movflags": "+faststart"}) as dst:
        ostream = None
        offset = 0
        for seg in segments:
            with av.open(str(seg)) as src:
                istream = src.streams.video[0]
                if ostream is None:
                    ostream = dst.add_stream_from_template(istream)
                last = 0
                for packet in src.demux(istream):
                    if packet.dts is None:  # the demuxer's end-of-stream marker
                        continue
                    assert packet.pts is not None
                    last = max(last, packet.pts + (packet.duration or 0))
                    packet.pts += offset
                    packet.dts += offset
                    packet.stream = ostream
                    dst.mux(packet)
                    frames += 1
                offset += last
    return EncodedFile(out, frames, out.stat().st_size, sha256_file(out))


def read_frames_rgb(path: Path) -> list[np.ndarray]:
    """Decode every frame of a video to (H, W, 3) uint8 RGB (for checks and examples)."""
    with av.open(str(path)) as src:
        return [f.to_ndarray(format="rgb24") for f in src.decode(video=0)]
