"""PyAV MP4 segment writer: H.264 in fragmented MP4 from yuv420p planes, BT.709 limited range.

Frames arrive already in yuv420p (converted on the GPU), so no swscale runs here; libx264
releases the GIL while it encodes, so several segments encode in parallel threads.

Each segment is written once, as one CMAF-style fragmented MP4 that serves two readers: its
init part (``ftyp`` + ``moov``) followed by ``moof``/``mdat`` fragments whose decode times
(``tfdt``) continue the job's timeline (segment k starts at its first frame's global index).
So the file is a complete MP4 on its own (PyAV, ffprobe, players) and, cut at
:attr:`EncodedFile.init_bytes`, an HLS init segment plus a media segment (see worker/sinks/hls.py).
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from producer.wire.spec import VideoSpec

#: empty_moov + delay_moov: the moov (no samples) is written with the first fragment, once the
#: first timestamp is known; frag_discont: that fragment's tfdt is the packet's own decode
#: time instead of 0; cmaf: CMAF brands; skip_trailer: no mfra box after the last fragment
#: (a media segment holds nothing but moof/mdat).
FMP4_FLAGS = "+cmaf+frag_keyframe+empty_moov+default_base_moof+delay_moov+frag_discont+skip_trailer"

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
    init_bytes: int = 0  # fragmented MP4: size of ftyp+moov, where the first moof starts


class SegmentEncoder:
    """Encodes one fragmented MP4 file; ``add`` frames in order, then ``close``.

    ``first_frame``: the global index of the segment's first frame; its timestamps start
    there, so consecutive segments form one continuous timeline.
    """

    def __init__(
        self, path: Path, width: int, height: int, video: VideoSpec, first_frame: int = 0
    ) -> None:
        self.path = path
        self.frames = 0
        self.first_frame = first_frame
        self.container = av.open(str(path), mode="w", options={"movflags": FMP4_FLAGS})
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
        frame.pts = self.first_frame + self.frames
        self.frames += 1
        for packet in self.stream.encode(frame):
            self.container.mux(packet)

    def close(self) -> EncodedFile:
        for packet in self.stream.encode(None):
            self.container.mux(packet)
        self.container.close()
        return EncodedFile(self.path, self.frames, self.path.stat().st_size,
                           sha256_file(self.path), init_size(self.path))

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


def init_size(path: Path) -> int:
    """Bytes before the first top-level ``moof`` box of a fragmented MP4 (ftyp + moov)."""
    offset = 0
    with path.open("rb") as f:
        while header := f.read(8):
            if len(header) < 8:
                break
            size, kind = struct.unpack(">I4s", header)
            if kind == b"moof":
                return offset
            if size == 1:  # 64-bit size follows the type
                size = struct.unpack(">Q", f.read(8))[0]
            if size < 8:  # 0: "to the end of file"; below 8: not a box
                break
            offset += size
            f.seek(offset)
    raise ValueError(f"{path}: no moof box: not a fragmented MP4")


def concat_segments(segments: list[Path], out: Path) -> EncodedFile:
    """Stitch MP4 segments into one file by remuxing packets (no re-encode).

    Decode times are made continuous across segments: each segment's packets are shifted so
    that its first one follows the previous segment's last (a no-op for segments that
    already carry the job's timeline, as :class:`SegmentEncoder` writes them).
    """
    frames = 0
    with av.open(str(out), mode="w", options={"movflags": "+faststart"}) as dst:
        ostream = None
        end: int | None = None  # decode time just after the last packet written
        for seg in segments:
            with av.open(str(seg)) as src:
                istream = src.streams.video[0]
                if ostream is None:
                    ostream = dst.add_stream_from_template(istream)
                shift: int | None = None
                for packet in src.demux(istream):
                    if packet.dts is None:  # the demuxer's end-of-stream marker
                        continue
                    assert packet.pts is not None
                    if shift is None:
                        shift = 0 if end is None else end - packet.dts
                    packet.pts += shift
                    packet.dts += shift
                    end = packet.dts + (packet.duration or 1)
                    packet.stream = ostream
                    dst.mux(packet)
                    frames += 1
    return EncodedFile(out, frames, out.stat().st_size, sha256_file(out))


def read_frames_rgb(path: Path) -> list[np.ndarray]:
    """Decode every frame of a video to (H, W, 3) uint8 RGB (for checks and examples)."""
    with av.open(str(path)) as src:
        return [f.to_ndarray(format="rgb24") for f in src.decode(video=0)]
