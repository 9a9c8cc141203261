"""The Wan VAE decoders as pure functions of one latent frame and their causal caches.

diffusers keeps the decoder's causal history in a Python list on the model, with a string
marker ("Rep") in it after the first chunk and caches of one or two frames: every chunk
mutates that list, so ``torch.compile`` cannot capture a chunk as one graph and no CUDA graph
can be taken of it. Here the history is a list of tensors passed in and returned; after the
first chunk every entry has exactly ``CACHE_T`` frames, so every later chunk at one
resolution has the same shapes — the steady state that ``wan_graph`` compiles and captures.

Equal to diffusers' ``vae.decode`` chunk by chunk (up to float rounding of the convolution
algorithms chosen): the first chunk's history is the zeros diffusers pads with, written out.
Changes that make it cheaper, all exact in real arithmetic: the spatial zero padding of each
causal convolution is done by the convolution itself (diffusers copies the whole activation
through ``F.pad`` first); the optional ``subpixel`` form runs each nearest 2× upsample + 3×3
convolution as one 2×2 convolution with four times the output channels on the low-resolution
input, one output channel block per output pixel phase (16 instead of 36 multiply-adds per
output pixel and channel pair, and the 4× larger upsampled activation is never written); and the
optional ``stack_time`` form runs a 3×k×k convolution as a 2-D convolution over three frames
stacked on the channel axis.

Both layouts of ``AutoencoderKLWan`` are covered: Wan2.1's (plain up blocks) and Wan2.2's
(TI2V-5B: residual up blocks whose shortcut is the block input duplicated up to the output
size, ``DupUp3D``, and 2×2 patching of the output, undone inside the step).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F

#: Frames of causal history each convolution keeps (diffusers' CACHE_T).
CACHE_T = 2

Caches = list[torch.Tensor]


def supports(vae: Any) -> bool:
    """Wan2.1-layout decoders (plain up blocks, no patching) and Wan2.2's (residual up blocks,
    optional patching); a mix of the two does not exist and is refused."""
    cfg = vae.config
    residual = bool(cfg.get("is_residual", False))
    return residual or cfg.get("patch_size") is None


class WanStep:
    """``step(z, caches) -> (frames, caches)`` over an ``AutoencoderKLWan``'s own modules.

    ``z``: one latent frame (B, C, 1, h, w). ``caches``: None for the first chunk, else what
    the previous call returned. Frames come back clamped to [-1, 1]: (B, 3, F, H, W), F = 1
    for the first chunk and 4 after it. Nothing is kept between calls.
    """

    def __init__(self, vae: Any, *, stack_time: bool = False, subpixel: bool = False) -> None:
        """``subpixel``: the upsample convolutions in their sub-pixel form (kernels derived from
        the model's weights here, once: a later change of those weights is not seen)."""
        if not supports(vae):
            raise ValueError("WanStep: patching without residual up blocks is no Wan decoder")
        self.post_quant_conv = vae.post_quant_conv
        self.decoder = vae.decoder
        self.residual = bool(vae.config.get("is_residual", False))
        self.patch_size: int | None = vae.config.get("patch_size")
        self.stack_time = stack_time
        # Per up block: (2×2 kernel of 4·C_out channels, bias repeated 4×), or None. Indexed
        # by position, not by module id: what the compiled graph reads must be named the same
        # in every process, or the AOTAutograd cache misses on every worker start.
        self._subpixel: list[tuple[torch.Tensor, torch.Tensor | None] | None] = [
            subpixel_kernel(rs.resample[1]) if subpixel and rs is not None else None
            for rs in map(self._upsampler, self.decoder.up_blocks)]

    def __call__(
        self, z: torch.Tensor, caches: Sequence[torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, Caches]:
        first = caches is None
        # itertools.repeat, not a generator: dynamo traces it in every torch this runs on (the
        # compiled first chunk passes no history).
        history: Iterator[torch.Tensor | None] = (
            iter(caches) if caches is not None else itertools.repeat(None))
        new: Caches = []
        dec = self.decoder
        x = _conv(self.post_quant_conv, z)
        x = self._causal(dec.conv_in, x, next(history), new)
        mid = dec.mid_block
        x = self._residual(mid.resnets[0], x, history, new)
        for attn, res in zip(mid.attentions, mid.resnets[1:], strict=True):
            x = self._residual(res, attn(x), history, new)
        for up, sub in zip(dec.up_blocks, self._subpixel, strict=True):
            shortcut = x
            for res in up.resnets:
                x = self._residual(res, x, history, new)
            upsampler = self._upsampler(up)
            if upsampler is not None:
                x = self._resample(upsampler, x, history, new, first, sub)
            if self.residual and up.avg_shortcut is not None:
                # Wan2.2: the block input, channels repeated and spread over the upsampled
                # pixels (and frames); pure, so diffusers' defensive clone is not needed.
                x = x + up.avg_shortcut(shortcut, first_chunk=first)
        x = self._causal(dec.conv_out, dec.nonlinearity(dec.norm_out(x)), next(history), new)
        if self.patch_size is not None:
            x = _unpatchify(x, self.patch_size)
        return x.clamp(-1.0, 1.0), new

    def _upsampler(self, up: Any) -> Any:
        if self.residual:
            return up.upsampler
        return up.upsamplers[0] if up.upsamplers is not None else None

    def _residual(
        self, res: Any, x: torch.Tensor, history: Iterator[torch.Tensor | None], new: Caches
    ) -> torch.Tensor:
        h = x if isinstance(res.conv_shortcut, torch.nn.Identity) else _conv(res.conv_shortcut, x)
        x = self._causal(res.conv1, res.nonlinearity(res.norm1(x)), next(history), new)
        x = self._causal(res.conv2, res.nonlinearity(res.norm2(x)), next(history), new)
        return x + h  # dropout is the identity in eval mode

    def _causal(
        self, conv: Any, x: torch.Tensor, cache: torch.Tensor | None, new: Caches
    ) -> torch.Tensor:
        """diffusers' WanCausalConv3d with history: [cache, x] along time, padded spatially by
        the convolution itself. The new history is the last CACHE_T frames of [cache, x]."""
        xin = _with_history(x, cache)
        new.append(xin[:, :, -CACHE_T:].clone())
        pad_w, _, pad_h = conv._padding[:3]
        if self.stack_time and conv.kernel_size[0] == CACHE_T + 1 and conv.stride == (1, 1, 1):
            return _stacked_conv(xin, conv.weight, conv.bias, (pad_h, pad_w))
        return F.conv3d(xin, conv.weight, conv.bias, conv.stride, (0, pad_h, pad_w))

    def _resample(
        self, rs: Any, x: torch.Tensor, history: Iterator[torch.Tensor | None], new: Caches,
        first: bool, sub: tuple[torch.Tensor, torch.Tensor | None] | None,
    ) -> torch.Tensor:
        b, c, t, h, w = x.shape
        if rs.mode == "upsample3d":
            cache = next(history)
            if first:
                # diffusers marks this slot "Rep" and skips the temporal conv: the next chunk
                # then pads with zeros, which is what a zero history does.
                new.append(x.new_zeros((b, c, CACHE_T, h, w)).contiguous(
                    memory_format=_format(x)))
            else:
                x = self._causal(rs.time_conv, x, cache, new)
                # (b, 2c, t) → (b, c, 2t): the two output halves interleave in time.
                x = x.reshape(b, 2, c, t, h, w)
                x = torch.stack((x[:, 0], x[:, 1]), 3).reshape(b, c, t * 2, h, w)
        elif rs.mode != "upsample2d":
            raise ValueError(f"WanStep: unexpected resample mode {rs.mode!r} in a decoder")
        t = x.shape[2]
        x2 = x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w)
        y = rs.resample(x2) if sub is None else subpixel_conv(x2, *sub)
        return y.view(b, t, *y.shape[1:]).permute(0, 2, 1, 3, 4)


#: Per output phase (0: even, 1: odd output row/column), the 2 input taps a 3-tap kernel
#: after a nearest 2× upsample reduces to: phase 0 reads input rows (y-1, y) with weights
#: (k₀, k₁ + k₂), phase 1 rows (y, y+1) with (k₀ + k₁, k₂).
_PHASE_TAPS = (((0,), (1, 2)), ((0, 1), (2,)))


def subpixel_kernel(conv: torch.nn.Conv2d) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The sub-pixel form of ``conv`` (3×3, padding 1) applied after a nearest 2× upsample:
    a 2×2 kernel of shape (4·O, I, 2, 2), blocks in phase order (row phase, column phase),
    summed in fp32 and stored in the weight's dtype and memory format."""
    w = conv.weight.detach().float()
    if tuple(w.shape[2:]) != (3, 3) or conv.padding != (1, 1) or conv.stride != (1, 1):
        raise ValueError(f"subpixel_kernel: needs a 3×3 conv with padding 1, got {conv}")
    blocks = []
    for rows in _PHASE_TAPS:
        for cols in _PHASE_TAPS:
            k = torch.stack([torch.stack([w[:, :, list(r)][:, :, :, list(c)].sum((2, 3))
                                          for c in cols], -1) for r in rows], -2)
            blocks.append(k)
    kernel = torch.cat(blocks, 0).to(conv.weight.dtype)
    if conv.weight.is_contiguous(memory_format=torch.channels_last) \
            and not conv.weight.is_contiguous():
        kernel = kernel.contiguous(memory_format=torch.channels_last)
    bias = None if conv.bias is None else conv.bias.detach().repeat(4)
    return kernel, bias


def subpixel_conv(x: torch.Tensor, kernel: torch.Tensor, bias: torch.Tensor | None
                  ) -> torch.Tensor:
    """(N, I, h, w) → (N, O, 2h, 2w): equal to ``conv(upsample_nearest_2x(x))``. One conv over
    the input padded by 1 gives (h+1)×(w+1) positions per phase; phase (a, b) of output pixel
    (y, x) sits at position (y+a, x+b) of its channel block."""
    n, _, h, w = x.shape
    y = F.conv2d(x, kernel, bias, padding=1)
    o = kernel.shape[0] // 4
    y = y.view(n, 2, 2, o, h + 1, w + 1)
    rows = [torch.stack([y[:, a, b, :, a : a + h, b : b + w] for b in (0, 1)], -1)
            for a in (0, 1)]
    return torch.stack(rows, 3).reshape(n, o, 2 * h, 2 * w)


def _unpatchify(x: torch.Tensor, p: int) -> torch.Tensor:
    """diffusers' ``unpatchify``: (b, c·p·p, t, h, w) → (b, c, t, h·p, w·p), channel order
    (c, p_w, p_h) as diffusers packs it."""
    b, cp, t, h, w = x.shape
    x = x.reshape(b, cp // (p * p), p, p, t, h, w).permute(0, 1, 4, 5, 3, 6, 2)
    return x.reshape(b, cp // (p * p), t, h * p, w * p)


def _format(x: torch.Tensor) -> torch.memory_format:
    return torch.channels_last_3d if x.is_contiguous(memory_format=torch.channels_last_3d) \
        and not x.is_contiguous() else torch.contiguous_format


def _with_history(x: torch.Tensor, cache: torch.Tensor | None) -> torch.Tensor:
    if cache is None:  # first chunk: diffusers pads the causal side with zeros
        b, c, _, h, w = x.shape
        cache = x.new_zeros((b, c, CACHE_T, h, w))
    return torch.cat([cache, x], dim=2)


def _conv(conv: Any, x: torch.Tensor) -> torch.Tensor:
    """A causal conv with no temporal kernel (1×1×1): no history, no padding."""
    return F.conv3d(x, conv.weight, conv.bias, conv.stride)


def _stacked_conv(
    xin: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, padding: tuple[int, int]
) -> torch.Tensor:
    """Conv3d with a 3-frame temporal kernel as one 2-D conv: output frame t reads frames
    t..t+2, stacked on the channel axis, against the weight reshaped to (O, 3·C, kh, kw)."""
    b, c, tin, h, w = xin.shape
    t = tin - CACHE_T
    frames = xin.permute(0, 2, 1, 3, 4)  # (b, tin, c, h, w)
    stacked = torch.cat([frames[:, k : k + t] for k in range(CACHE_T + 1)], dim=2)
    stacked = stacked.reshape(b * t, (CACHE_T + 1) * c, h, w)
    o = weight.shape[0]
    w2 = weight.permute(0, 2, 1, 3, 4).reshape(o, (CACHE_T + 1) * c, *weight.shape[3:])
    y = F.conv2d(stacked, w2, bias, padding=padding)
    return y.view(b, t, o, h, w).permute(0, 2, 1, 3, 4)


def set_memory_format(vae: Any, fmt: torch.memory_format) -> None:
    """Lay the conv weights out in ``fmt`` (``channels_last_3d`` or contiguous); activations
    follow the weights. ``Module.to(memory_format=...)`` refuses the 1-D biases."""
    fmt2 = torch.channels_last if fmt == torch.channels_last_3d else torch.contiguous_format
    for param in vae.parameters():
        if param.dim() == 5:
            param.data = param.data.contiguous(memory_format=fmt)
        elif param.dim() == 4:
            param.data = param.data.contiguous(memory_format=fmt2)
