"""A short MP4 in memory from a few RGB frames, scaled up while it converts: a preview's file.

The frames are small (one pixel per latent cell); swscale upsamples them (bilinear) in the
same pass that converts RGB to yuv420p for libx264, on the calling thread (the preview writer,
never the job's). The file is a plain MP4, written in memory (a few kB to a few hundred).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import av
import numpy as np

from worker.pipeline.encode import BT709, frame_rate


@dataclass(frozen=True)
class Clip:
    """An encoded clip: its bytes and what it holds."""

    data: bytes
    width: int
    height: int
    frames: int
    fps: float


def encode_clip(rgb: np.ndarray, scale: int, fps: float, crf: int = 23) -> Clip:
    """``rgb`` (T, h, w, 3) uint8 → an H.264 MP4 of T frames of (w·scale) × (h·scale) pixels
    (rounded down to even sizes: yuv420p), at ``fps``."""
    if rgb.ndim != 4 or rgb.shape[-1] != 3 or rgb.dtype != np.uint8 or not rgb.shape[0]:
        raise ValueError(f"expected (T, h, w, 3) uint8 frames, got {rgb.shape} {rgb.dtype}")
    width = max(2, rgb.shape[2] * scale // 2 * 2)
    height = max(2, rgb.shape[1] * scale // 2 * 2)
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as out:
        rate = frame_rate(fps)
        stream = out.add_stream("libx264", rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.time_base = 1 / rate
        stream.options = {"crf": str(crf), "preset": "ultrafast", "tune": "zerolatency"}
        stream.codec_context.colorspace = BT709
        for i, frame in enumerate(rgb):
            src = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
            yuv = src.reformat(width=width, height=height, format="yuv420p",
                               interpolation="BILINEAR", dst_colorspace="ITU709")
            yuv.pts = i
            for packet in stream.encode(yuv):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return Clip(buf.getvalue(), width, height, int(rgb.shape[0]), float(fps))
