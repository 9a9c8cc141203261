"""Checkable frames: each frame carries its global frame index as big black/white cells.

Cells are large (a 6×4 grid over the whole frame) and far apart in value, so the index survives
H.264 at the default CRF and a round trip through YUV 4:2:0. Tests and users verify a video with
:func:`read_frame_index`: no loss, no duplicate, right order.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from worker.decoders.base import SPATIAL_RATIO, chunk_frames

GRID_COLS, GRID_ROWS = 6, 4
BITS = GRID_COLS * GRID_ROWS  # 24 bits: 16.7 M frames
LEVEL = 0.8  # ±0.8 in [-1, 1]: luma ≈ 40 / 215, far from the 128 threshold


def _cell_bounds(size: int, cells: int, i: int) -> tuple[int, int]:
    return (i * size) // cells, ((i + 1) * size) // cells


def pattern_frames(first: int, count: int, height: int, width: int) -> torch.Tensor:
    """Frames ``first … first+count-1`` as (3, count, H, W) float32 in [-1, 1] (CPU)."""
    out = torch.empty((3, count, height, width), dtype=torch.float32)
    for k in range(count):
        index = first + k
        for bit in range(BITS):
            row, col = divmod(bit, GRID_COLS)
            y0, y1 = _cell_bounds(height, GRID_ROWS, row)
            x0, x1 = _cell_bounds(width, GRID_COLS, col)
            out[:, k, y0:y1, x0:x1] = LEVEL if (index >> bit) & 1 else -LEVEL
    return out


def read_frame_index(rgb: np.ndarray) -> int:
    """Read the index back from one decoded frame, ``rgb`` of shape (H, W, 3) uint8."""
    if rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError(f"expected an (H, W, 3) frame, got shape {rgb.shape}")
    height, width = rgb.shape[:2]
    luma = rgb.astype(np.float32).mean(axis=2)
    index = 0
    for bit in range(BITS):
        row, col = divmod(bit, GRID_COLS)
        y0, y1 = _cell_bounds(height, GRID_ROWS, row)
        x0, x1 = _cell_bounds(width, GRID_COLS, col)
        # The centre half of the cell: edges blur under chroma subsampling and H.264.
        dy, dx = (y1 - y0) // 4, (x1 - x0) // 4
        if luma[y0 + dy : y1 - dy, x0 + dx : x1 - dx].mean() > 127.5:
            index |= 1 << bit
    return index


class PatternDecoder:
    """A stand-in decoder with the Wan chunk layout whose output is checkable.

    ``load_ms`` adds a synthetic GPU load per chunk (matrix products on the device) so
    benchmarks can stand in for decode time without the VAE.
    """

    name = "pattern"
    latent_channels = 16

    def __init__(self, device: torch.device | str = "cpu", load_ms: float = 0.0) -> None:
        self.device = torch.device(device)
        self.load_ms = load_ms
        self._load_n = 2048

    def output_size(self, latent_h: int, latent_w: int) -> tuple[int, int]:
        return latent_h * SPATIAL_RATIO, latent_w * SPATIAL_RATIO

    def warmup(self, latent_h: int, latent_w: int) -> None:
        for _ in self.stream(torch.zeros((self.latent_channels, 2, latent_h, latent_w))):
            pass

    def _synthetic_load(self) -> None:
        if self.load_ms <= 0:
            return
        a = torch.ones((self._load_n, self._load_n), device=self.device)
        # ~2 n^3 flop per product; the count is calibrated only roughly: a stand-in, not a model.
        reps = max(1, int(self.load_ms))
        for _ in range(reps):
            a = torch.tanh(a @ a * (1.0 / self._load_n))

    def stream(self, latents: torch.Tensor) -> Iterator[torch.Tensor]:
        _, t, h, w = latents.shape
        height, width = self.output_size(h, w)
        first = 0
        for i in range(t):
            n = chunk_frames(i)
            self._synthetic_load()
            yield pattern_frames(first, n, height, width).to(self.device, non_blocking=True)
            first += n
