"""8-bit attention for the fp8 tier: Q, K and V in float8 e4m3, the softmax's P in float8.

Every tier ran attention in bfloat16, and attention is the largest part of a step (45.7 % of an
eager 5B forward on an H100, ``bench/generate/attention.py``). This is the fp8 tier's
attention over the video tokens (the blocks' self-attention; the cross-attention to 512 text
tokens is small and stays bfloat16).

Quantisation (``quantise``), inside the compiled blocks, so inductor fuses it into the ops
around it (an amax reduction, then one pass that scales, clamps and casts): one scale per
tensor, ``amax / 448`` (the largest e4m3 value), the amax floored like the linears' activation
scales so a tensor of zeros quantises to zeros, not NaN. One scale per tensor is what cuDNN's
float8 attention takes. K is smoothed first (its mean over the tokens subtracted, per head and
channel, as SageAttention does): ``q·(k − k̄) = q·k − q·k̄``, and a constant per query row leaves
the softmax unchanged, so the result is the same in exact arithmetic while K's range, and with it
the rounding error, shrinks. V is centred the same way and its mean added back to the output (a
softmax row sums to 1): an offset common to the tokens costs no float8 precision.

Kernels (``KERNELS``), chosen per GPU by ``worker.generate.tier.attnchoice``:

- ``cudnn``: cuDNN's float8 attention (``worker.generate.tier.cudnn8``), compute capability 9.0+;
- ``reference``: the same arithmetic in plain torch, float8 rounding of Q, K, V, P and the
  output simulated and products in float32, queries in chunks. It stands in on the CPU (tests,
  the bench's ``--tiny``), where no 8-bit attention kernel exists, so the tier's code path and
  its quality check run there; it is the error model of the kernel, not a fast path.
"""

from __future__ import annotations

import torch

from worker.generate.tier import cudnn8

F8 = torch.float8_e4m3fn
#: The largest float8 e4m3 value.
E4M3_MAX = 448.0
#: Floor of a tensor's amax (as the fp8 linears' activation scales: ``tiers.FP8_ACTIVATION_LB``).
AMAX_LB = 1e-12
P_SCALE = cudnn8.P_SCALE
KERNELS = ("cudnn", "reference")
#: Fewer query tokens than this run exact attention even where ``cudnn`` is chosen: the
#: quantisation's passes grow with the tokens, the attention with their square. On an H100 the
#: compiled 8-bit path took 0.82 ms against bf16's 0.67 at 5,070 tokens (24 heads) and 11.1
#: against 15.4 at 27,280 (bench/results/attention-h100.md): even at about 7,000.
CUDNN_MIN_TOKENS = 8192
#: Query rows per chunk of the reference (bounds its score matrix).
REFERENCE_CHUNK = 2048


def quantise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x in float8 e4m3, its descale as a (1, 1, 1, 1) float32 tensor): x ≈ x8 · descale."""
    amax = x.abs().amax().float().clamp_min(AMAX_LB)
    scale = E4M3_MAX / amax
    x8 = (x.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(F8)
    return x8, (1.0 / scale).reshape(1, 1, 1, 1)


def reference(q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor, descale_q: torch.Tensor,
              descale_k: torch.Tensor, descale_v: torch.Tensor, scale: float) -> torch.Tensor:
    """What ``cudnn8.attn8_cudnn`` computes, in plain torch: (b, s, h, d) float8 in and out
    (the attention divided by ``descale_v``, as the kernel writes it). P = exp(s − rowmax) in
    [0, 1] is rounded to float8 at ``P_SCALE`` before its product with V; its row sums are
    taken before rounding, as the kernel does."""
    q = (q8.float() * descale_q).transpose(1, 2)
    k = (k8.float() * descale_k).transpose(1, 2)
    v = v8.float().transpose(1, 2)
    chunks = []
    for start in range(0, q.shape[2], REFERENCE_CHUNK):
        s = q[:, :, start:start + REFERENCE_CHUNK] @ k.transpose(-1, -2) * scale
        p = torch.exp(s - s.amax(dim=-1, keepdim=True))
        rows = p.sum(dim=-1, keepdim=True)
        p8 = (p * P_SCALE).to(F8).float()
        chunks.append((p8 @ v) / (P_SCALE * rows))
    out = torch.cat(chunks, dim=2).transpose(1, 2)
    return out.clamp(-E4M3_MAX, E4M3_MAX).to(F8)


def attention8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel: str) -> torch.Tensor:
    """softmax(q·kᵀ/√d)·v through ``kernel`` (one of ``KERNELS``), q, k, v and the result
    (batch, tokens, heads, head_dim) in q's dtype."""
    if kernel not in KERNELS:
        raise ValueError(f"8-bit attention kernel {kernel!r} is none of {KERNELS}")
    kf, vf = k.float(), v.float()
    v_mean = vf.mean(dim=1, keepdim=True)
    q8, dq = quantise(q)
    k8, dk = quantise(kf - kf.mean(dim=1, keepdim=True))
    v8, dv = quantise(vf - v_mean)
    scale = q.shape[-1] ** -0.5
    if kernel == "cudnn":
        out = torch.ops.framefleet_attn.attn8_cudnn(q8, k8, v8, dq, dk, dv, scale)
    else:
        out = reference(q8, k8, v8, dq, dk, dv, scale)
    # a softmax row sums to 1: P·(v − v̄) + v̄ = P·v
    return (out.float() * dv + v_mean).to(q.dtype)
