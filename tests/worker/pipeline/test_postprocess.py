"""RGB → yuv420p (BT.709 limited range) on the CPU path, checked against the formula."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from worker.pipeline.encode import read_frames_rgb
from worker.pipeline.postprocess import rgb_to_yuv420, yuv420_shape


def _planes(chunk: torch.Tensor) -> torch.Tensor:
    _, f, h, w = chunk.shape
    out = torch.empty(yuv420_shape(f, h, w), dtype=torch.uint8)
    return rgb_to_yuv420(chunk, out)


@pytest.mark.parametrize(
    ("rgb", "yuv"),
    [
        ((-1.0, -1.0, -1.0), (16, 128, 128)),  # black
        ((1.0, 1.0, 1.0), (235, 128, 128)),  # white
        ((1.0, -1.0, -1.0), (63, 102, 240)),  # BT.709 red
        ((-1.0, 1.0, -1.0), (173, 42, 26)),  # BT.709 green
        ((-1.0, -1.0, 1.0), (32, 240, 118)),  # BT.709 blue
    ],
)
def test_reference_colours(rgb: tuple[float, float, float], yuv: tuple[int, int, int]) -> None:
    chunk = torch.tensor(rgb).view(3, 1, 1, 1).expand(3, 2, 4, 6).contiguous()
    planes = _planes(chunk).view(2, -1)
    y, u, v = planes[:, :24], planes[:, 24:30], planes[:, 30:]
    assert int(y.min()) == int(y.max()) == yuv[0]
    assert int(u.min()) == int(u.max()) == yuv[1]
    assert int(v.min()) == int(v.max()) == yuv[2]


def test_chroma_is_2x2_average_and_values_clamp() -> None:
    chunk = torch.full((3, 1, 2, 2), -1.0)
    chunk[:, 0, 0, 0] = 5.0  # out of range: clamped to white
    planes = _planes(chunk).view(-1)
    assert planes[0] == 235 and planes[1] == 16
    assert planes[4] == 128 and planes[5] == 128  # grey average keeps neutral chroma


def test_bad_out_buffer_is_rejected() -> None:
    with pytest.raises(ValueError, match="uint8"):
        rgb_to_yuv420(torch.zeros(3, 1, 4, 4), torch.empty((1, 6, 4), dtype=torch.float32))
    with pytest.raises(ValueError, match="even"):
        yuv420_shape(1, 5, 4)


def test_encoded_colours_read_back(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Given a mid-grey-and-colour frame encoded through the segment writer (BT.709 tags)
    from producer.wire.spec import VideoSpec
    from worker.pipeline.encode import SegmentEncoder, yuv_frame

    chunk = torch.zeros(3, 1, 64, 64)
    chunk[0, 0, :, :32] = 0.6
    chunk[2, 0, :, 32:] = -0.6
    planes = _planes(chunk)
    enc = SegmentEncoder(tmp_path / "c.mp4", 64, 64, VideoSpec(crf=10))
    enc.add(yuv_frame(planes[0].numpy()))
    enc.close()
    # When decoded back to RGB by FFmpeg
    rgb = read_frames_rgb(tmp_path / "c.mp4")[0].astype(np.int16)
    expected = ((chunk[:, 0].permute(1, 2, 0) + 1) * 127.5).round().numpy().astype(np.int16)
    # Then colours match away from the edge between the halves
    assert np.abs(rgb[8:-8, 4:24] - expected[8:-8, 4:24]).max() <= 6
    assert np.abs(rgb[8:-8, 40:60] - expected[8:-8, 40:60]).max() <= 6
