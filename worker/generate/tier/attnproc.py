"""Which kernel a tier's self-attention runs: an attention processor over diffusers' own.

``install`` puts a ``TierAttention`` on every block's self-attention (``attn1``) of a Wan
transformer; it keeps diffusers' processor and hands every call it does not change to it
(cross-attention, masks, the image branch of I2V, and every call while its mode is
``stock``). What it changes, it asks its ``Mode`` at trace time (``worker.generate.tier.
attnchoice`` fills it per GPU), so the compiled blocks hold one kernel, guarded like any
constant:

- ``stock``: diffusers' processor as it is (today's graph, bit for bit);
- an exact backend (``EXACT_BACKENDS``: cuDNN, flash, efficient, math): the same attention in
  bfloat16 through that one SDPA kernel, where it is faster on this GPU than the default;
- ``attn8``: the fp8 tier's 8-bit attention (``worker.generate.tier.attn8``) with its kernel
  (cuDNN's from ``attn8.CUDNN_MIN_TOKENS`` tokens on: below, exact).

The self-attention path is diffusers' ``WanAttnProcessor`` (QKV projections, RMS norms of Q
and K, heads, rotary embedding, output projection) with only the attention call swapped;
``tests/worker/generate/tier/test_attnproc.py`` holds it to diffusers' output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from worker.generate.tier.attn8 import CUDNN_MIN_TOKENS, attention8

#: The exact (bfloat16) attention kernels: aten's SDPA ops, called directly so that a compiled
#: graph holds the one that was chosen.
EXACT_BACKENDS = ("cudnn", "flash", "efficient", "math")


@dataclass
class Mode:
    """What a transformer's self-attention runs: ``exact`` (``stock`` or one of
    ``EXACT_BACKENDS``) and, for the fp8 tier, ``attn8`` (a kernel of ``attn8.KERNELS``, or
    None: that tier's attention stays exact)."""

    exact: str = "stock"
    attn8: str | None = None


def exact_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    backend: str) -> torch.Tensor:
    """softmax(q·kᵀ/√d)·v through one SDPA kernel; (batch, tokens, heads, head_dim) in and
    out (aten's ops take heads first: transposed views, no copy)."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    aten = torch.ops.aten
    if backend == "cudnn":
        out = aten._scaled_dot_product_cudnn_attention(q, k, v, None, False)[0]
    elif backend == "flash":
        out = aten._scaled_dot_product_flash_attention(q, k, v)[0]
    elif backend == "efficient":
        out = aten._scaled_dot_product_efficient_attention(q, k, v, None, False)[0]
    elif backend == "math":
        out = aten._scaled_dot_product_attention_math(q, k, v)[0]
    else:
        raise ValueError(f"exact attention backend {backend!r} is none of {EXACT_BACKENDS}")
    return out.transpose(1, 2)


def _rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Wan's rotary embedding, as diffusers' processor applies it."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = cos[..., 0::2], sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)


class TierAttention:
    """A Wan attention processor: diffusers' ``stock`` one, with the self-attention's kernel
    taken from ``mode`` (``eight``: this transformer is the fp8 tier's)."""

    def __init__(self, stock: Any, mode: Mode, eight: bool) -> None:
        self.stock, self.mode, self.eight = stock, mode, eight

    def __call__(self, attn: Any, hidden_states: torch.Tensor,
                 encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None,
                 rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        kernel = self.mode.attn8 if self.eight else None
        if kernel == "cudnn" and hidden_states.shape[1] < CUDNN_MIN_TOKENS:
            kernel = None  # a short sequence: the quantisation would cost more than it saves
        backend = self.mode.exact
        if (kernel is None and backend == "stock") or encoder_hidden_states is not None \
                or attention_mask is not None or attn.add_k_proj is not None:
            return self.stock(attn, hidden_states, encoder_hidden_states, attention_mask,
                              rotary_emb)
        from diffusers.models.transformers.transformer_wan import _get_qkv_projections

        q, k, v = _get_qkv_projections(attn, hidden_states, None)  # type: ignore[arg-type]
        q, k = attn.norm_q(q), attn.norm_k(k)
        q, k, v = (t.unflatten(2, (attn.heads, -1)) for t in (q, k, v))
        if rotary_emb is not None:
            q, k = _rotary(q, *rotary_emb), _rotary(k, *rotary_emb)
        if kernel is not None:
            out = attention8(q, k, v, kernel)
        else:
            out = exact_attention(q, k, v, backend)
        out = out.flatten(2, 3).type_as(q)
        return attn.to_out[1](attn.to_out[0](out))


def self_attentions(transformer: Any) -> list[Any]:
    """The self-attention modules of a Wan transformer's blocks."""
    return [block.attn1 for block in getattr(transformer, "blocks", ())
            if hasattr(block, "attn1")]


def install(transformer: Any, mode: Mode, eight: bool) -> int:
    """A ``TierAttention`` over each self-attention's processor (once: installing again only
    points it at ``mode``); returns how many."""
    count = 0
    for attn in self_attentions(transformer):
        stock = attn.processor
        if isinstance(stock, TierAttention):
            stock = stock.stock
        attn.processor = TierAttention(stock, mode, eight)
        count += 1
    return count
