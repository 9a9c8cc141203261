"""The decoder protocol the pipeline drives."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import torch

#: Wan-style causal video VAE: latent frame 0 → 1 frame, every later latent frame → 4 frames.
TEMPORAL_RATIO = 4
SPATIAL_RATIO = 8


def frames_for_latents(latent_frames: int) -> int:
    return 1 + TEMPORAL_RATIO * (latent_frames - 1) if latent_frames > 0 else 0


def chunk_frames(index: int) -> int:
    """Frames in decoded chunk ``index`` (one chunk per latent frame)."""
    return 1 if index == 0 else TEMPORAL_RATIO


class ChunkDecoder(Protocol):
    """Decodes latents (C, T, h, w) into frames, one latent frame (= one chunk) at a time.

    ``stream`` yields tensors (3, F, H, W) in [-1, 1] on ``device``; on CUDA the work is
    queued on the current (compute) stream and the caller must not synchronise. A chunk may be
    overwritten by the next one: consume it before advancing the iterator.
    """

    name: str
    latent_channels: int
    device: torch.device

    def output_size(self, latent_h: int, latent_w: int) -> tuple[int, int]:
        """(height, width) of decoded frames."""
        ...

    def warmup(self, latent_h: int, latent_w: int) -> None:
        """Run once at this size so the first job pays no first-call costs."""
        ...

    def stream(self, latents: torch.Tensor) -> Iterator[torch.Tensor]: ...
