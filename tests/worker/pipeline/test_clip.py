"""A preview's MP4: it decodes with PyAV at the size and frame count it states, in colour."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest

from worker.pipeline.clip import encode_clip


def _decode(data: bytes) -> list[np.ndarray]:
    with av.open(io.BytesIO(data)) as f:
        return [frame.to_ndarray(format="rgb24") for frame in f.decode(video=0)]


@pytest.mark.parametrize(("t", "h", "w", "scale"), [(3, 4, 6, 4), (21, 60, 104, 4), (1, 9, 7, 2)])
def test_it_decodes_at_the_stated_size_and_frame_count(t: int, h: int, w: int,
                                                      scale: int) -> None:
    rgb = (np.random.default_rng(t).random((t, h, w, 3)) * 255).astype(np.uint8)
    clip = encode_clip(rgb, scale, fps=4.0)
    frames = _decode(clip.data)
    # odd sizes are rounded down to even ones (yuv420p)
    assert (clip.width, clip.height) == (w * scale // 2 * 2, h * scale // 2 * 2)
    assert clip.frames == t == len(frames) and clip.fps == 4.0
    assert all(f.shape == (clip.height, clip.width, 3) for f in frames)
    with av.open(io.BytesIO(clip.data)) as f:
        assert f.streams.video[0].codec_context.name == "h264"
        assert float(f.streams.video[0].average_rate or 0) == pytest.approx(4.0)


def test_colours_survive_the_upsample_and_the_encode() -> None:
    rgb = np.zeros((3, 4, 6, 3), np.uint8)
    rgb[..., 0], rgb[..., 1], rgb[..., 2] = 200, 50, 100
    rgb[1] = 255 - rgb[1]  # frames differ: each is its own picture
    frames = _decode(encode_clip(rgb, 4, fps=4.0).data)
    for got, want in zip(frames, rgb, strict=True):
        assert np.abs(got.reshape(-1, 3).mean(0) - want[0, 0]).max() < 4


@pytest.mark.parametrize("bad", [
    np.zeros((2, 4, 6), np.uint8), np.zeros((2, 4, 6, 3)), np.zeros((0, 4, 6, 3), np.uint8),
    np.zeros((2, 4, 6, 4), np.uint8)])
def test_anything_but_rgb_frames_is_refused(bad: np.ndarray) -> None:
    with pytest.raises(ValueError, match=r"expected \(T, h, w, 3\) uint8 frames"):
        encode_clip(bad, 4, fps=4.0)
