"""Decoded RGB chunk → yuv420p planes, on whatever device the chunk is on.

BT.709 limited range (Y 16–235, Cb/Cr 16–240), chroma from 2×2-averaged RGB. On the GPU this
turns 12 bytes/pixel (fp32 RGB) into 1.5 bytes/pixel before the copy over PCIe, and the encoder
gets planes it can take without swscale.

The conversion quantises to 8-bit RGB first (two separate float ops, so no fused multiply-add
can differ between devices), then uses fixed-point integer arithmetic: the CUDA path and the
CPU path give bit-identical planes, which is what lets tests compare them exactly.
"""

from __future__ import annotations

import torch

SHIFT = 16
_KR, _KB = 0.2126, 0.0722
_KG = 1.0 - _KR - _KB
_Y_SCALE = 219.0 / 255.0
_C_SCALE = 224.0 / 255.0


def _fixed(values: tuple[float, float, float], scale: float) -> tuple[int, int, int]:
    r, g, b = (round(v * scale * (1 << SHIFT)) for v in values)
    return r, g, b


# Coefficients on 8-bit R, G, B, in units of 2^-16 (ITU-R BT.709).
Y_COEF = _fixed((_KR, _KG, _KB), _Y_SCALE)
CB_COEF = _fixed((-_KR / (2 * (1 - _KB)), -_KG / (2 * (1 - _KB)), 0.5), _C_SCALE)
CR_COEF = _fixed((0.5, -_KG / (2 * (1 - _KR)), -_KB / (2 * (1 - _KR))), _C_SCALE)


def yuv420_shape(frames: int, height: int, width: int) -> tuple[int, int, int]:
    """Shape of the stacked planes buffer: (frames, H*3/2, W), PyAV's yuv420p ndarray layout."""
    if height % 2 or width % 2:
        raise ValueError(f"yuv420p needs even sizes, got {width}x{height}")
    return frames, height * 3 // 2, width


def _mix(rgb: torch.Tensor, coef: tuple[int, int, int], shift: int, offset: int) -> torch.Tensor:
    """``((rgb · coef + 2^(shift-1)) >> shift) + offset`` clamped to 0…255, in int32 and in place
    after the first product: five passes instead of eight. Adding ``offset << shift`` before
    the shift equals adding ``offset`` after it (a whole multiple of the divisor)."""
    acc = rgb[0] * coef[0]
    acc.add_(rgb[1], alpha=coef[1]).add_(rgb[2], alpha=coef[2])
    acc.add_((1 << (shift - 1)) + (offset << shift)).bitwise_right_shift_(shift)
    return acc.clamp_(0, 255)


def rgb_to_yuv420(chunk: torch.Tensor, out: torch.Tensor,
                  bad: torch.Tensor | None = None) -> torch.Tensor:
    """Write ``chunk`` (3, F, H, W) float in [-1, 1] as yuv420p into ``out`` (F, H*3/2, W) uint8.

    Runs on ``chunk``'s device and, on CUDA, on the current stream. ``out`` may be on the same
    device (GPU staging) or be a host tensor when ``chunk`` is on the CPU. ``bad`` (one int32
    on ``chunk``'s device) receives how many of the chunk's values are NaN or infinite: the
    clamp below would hide them (a NaN frame would encode as some colour), so the count goes
    with the planes and the writer refuses the chunk (queued, never a sync here).
    """
    _, f, h, w = chunk.shape
    if tuple(out.shape) != yuv420_shape(f, h, w) or out.dtype != torch.uint8:
        raise ValueError(f"out must be uint8 {yuv420_shape(f, h, w)}, got {tuple(out.shape)}")
    # A float32 copy of our own, then in place: clamp, +1, ×127.5 (two separate operations,
    # so no fused multiply-add can differ between devices), round half to even.
    x = chunk.to(torch.float32, copy=True)
    if bad is not None:
        bad.copy_(torch.isfinite(x).logical_not_().sum(dtype=torch.int32).view(1))
    x.clamp_(-1.0, 1.0).add_(1.0).mul_(127.5).round_()
    rgb = x.to(torch.int32)  # 8-bit RGB, exact integers from here on
    # Every product and sum below stays under 2^31 (chroma: 4 × 255 × 2^16 at most).
    y = _mix(rgb, Y_COEF, SHIFT, 16)
    # 2×2 sums of R, G, B (in int32, not sum's default int64); the extra shift of 2 divides
    # by 4 (the average).
    sums = rgb.view(3, f, h // 2, 2, w // 2, 2).sum(dim=(3, 5), dtype=torch.int32)
    cb = _mix(sums, CB_COEF, SHIFT + 2, 128)
    cr = _mix(sums, CR_COEF, SHIFT + 2, 128)
    flat = out.view(f, -1)
    n, q = h * w, (h // 2) * (w // 2)
    flat[:, :n].copy_(y.view(f, n))
    flat[:, n : n + q].copy_(cb.view(f, q))
    flat[:, n + q :].copy_(cr.view(f, q))
    return out
