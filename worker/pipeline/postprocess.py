"""Decoded RGB chunk → yuv420p planes, on whatever device the chunk is on.

BT.709 limited range (Y 16–235, Cb/Cr 16–240), chroma from 2×2-averaged RGB. On the GPU this
turns 12 bytes/pixel (fp32 RGB) into 1.5 bytes/pixel before the copy over PCIe, and the encoder
gets planes it can take without swscale.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Rows: Y, Cb, Cr as functions of R, G, B in [0, 1] (ITU-R BT.709).
_KR, _KB = 0.2126, 0.0722
_KG = 1.0 - _KR - _KB
_CB = (-_KR / (2 * (1 - _KB)), -_KG / (2 * (1 - _KB)), 0.5)
_CR = (0.5, -_KG / (2 * (1 - _KR)), -_KB / (2 * (1 - _KR)))


def yuv420_shape(frames: int, height: int, width: int) -> tuple[int, int, int]:
    """Shape of the stacked planes buffer: (frames, H*3/2, W), PyAV's yuv420p ndarray layout."""
    if height % 2 or width % 2:
        raise ValueError(f"yuv420p needs even sizes, got {width}x{height}")
    return frames, height * 3 // 2, width


def rgb_to_yuv420(chunk: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Write ``chunk`` (3, F, H, W) float in [-1, 1] as yuv420p into ``out`` (F, H*3/2, W) uint8.

    Runs on ``chunk``'s device and, on CUDA, on the current stream. ``out`` may be on the same
    device (GPU staging) or be a host tensor when ``chunk`` is on the CPU.
    """
    _, f, h, w = chunk.shape
    if tuple(out.shape) != yuv420_shape(f, h, w) or out.dtype != torch.uint8:
        raise ValueError(f"out must be uint8 {yuv420_shape(f, h, w)}, got {tuple(out.shape)}")
    rgb = chunk.float().clamp(-1.0, 1.0).add_(1.0).mul_(0.5)  # [0, 1]
    r, g, b = rgb[0], rgb[1], rgb[2]
    y = (r * _KR + g * _KG + b * _KB).mul_(219.0).add_(16.0)
    small = F.avg_pool2d(rgb.reshape(3 * f, 1, h, w), 2).reshape(3, f, h // 2, w // 2)
    rs, gs, bs = small[0], small[1], small[2]
    cb = (rs * _CB[0] + gs * _CB[1] + bs * _CB[2]).mul_(224.0).add_(128.0)
    cr = (rs * _CR[0] + gs * _CR[1] + bs * _CR[2]).mul_(224.0).add_(128.0)
    flat = out.view(f, -1)
    n, q = h * w, (h // 2) * (w // 2)
    flat[:, :n].copy_(y.reshape(f, n).round_().clamp_(0, 255))
    flat[:, n : n + q].copy_(cb.reshape(f, q).round_().clamp_(0, 255))
    flat[:, n + q :].copy_(cr.reshape(f, q).round_().clamp_(0, 255))
    return out
