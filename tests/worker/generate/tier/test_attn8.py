"""The fp8 tier's 8-bit attention on the CPU: its reference kernel (the stand-in where no
8-bit attention kernel exists) against exact attention, the smoothing's invariance, the
quantisation's floor and bounds, and cuDNN's kernel as one opaque node in a traced graph."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from worker.generate.tier import attn8
from worker.generate.tier.attnproc import exact_attention


def _qkv(tokens: int = 300, heads: int = 2, dim: int = 64, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, tokens, heads, dim, generator=g) for _ in range(3)]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_reference_is_exact_attention_within_float8_rounding() -> None:
    q, k, v = _qkv()
    exact = exact_attention(q, k, v, "math")
    got = attn8.attention8(q, k, v, "reference")
    assert got.shape == exact.shape and got.dtype == q.dtype
    # float8 e4m3 keeps 3 mantissa bits: a real rounding error, far from noise
    assert 5e-3 < _rel(got, exact) < 0.08
    # a new draw gives the same order of error: the function, not one input
    q2, k2, v2 = _qkv(seed=1)
    assert _rel(attn8.attention8(q2, k2, v2, "reference"), exact_attention(q2, k2, v2, "math")) \
        < 0.08


def test_an_offset_common_to_the_keys_or_values_costs_no_precision() -> None:
    q, k, v = _qkv()
    exact = exact_attention(q, k, v, "math")
    plain = _rel(attn8.attention8(q, k, v, "reference"), exact)
    # q·(k + c) = q·k + q·c, constant per query row: the exact result is unchanged, and the
    # smoothing removes c before the keys are rounded; a value offset is added back after
    key_bias = torch.linspace(-40, 40, 64)
    assert _rel(exact_attention(q, k + key_bias, v, "math"), exact) < 1e-5
    assert _rel(attn8.attention8(q, k + key_bias, v, "reference"), exact) < 1.1 * plain
    assert _rel(attn8.attention8(q, k, v + 25.0, "reference") - 25.0, exact) < 1.1 * plain
    # without the smoothing the offset takes the keys' float8 range: many times the error
    (q8, dq), (k8, dk), (v8, dv) = (attn8.quantise(t) for t in (q, k + key_bias, v))
    raw = attn8.reference(q8, k8, v8, dq, dk, dv, 64**-0.5)
    assert _rel(raw, exact) > 3 * plain


def test_quantise_bounds_and_floor() -> None:
    x = torch.randn(2, 100, 3, 8) * 7
    x8, descale = attn8.quantise(x)
    assert x8.dtype == torch.float8_e4m3fn and descale.shape == (1, 1, 1, 1)
    back = x8.float() * descale
    assert float(x8.float().abs().max()) == attn8.E4M3_MAX  # the range is used to its end
    assert _rel(back, x) < 2**-4  # 3 mantissa bits
    zeros8, zero_descale = attn8.quantise(torch.zeros(1, 4, 2, 8))
    assert torch.isfinite(zero_descale).all() and not zeros8.float().any()


def test_an_unknown_kernel_is_refused() -> None:
    q, k, v = _qkv(tokens=8)
    with pytest.raises(ValueError, match="'int4' is none of"):
        attn8.attention8(q, k, v, "int4")


class _Traced(Exception):
    pass


def test_cudnn_kernel_is_one_opaque_node_of_a_full_graph() -> None:
    """The quantisation is traced with the call (fullgraph: no break), and cuDNN's kernel is one
    custom op node; traced on the CPU through its fake implementation, never run."""
    graphs: list[Any] = []

    def capture(gm: torch.fx.GraphModule, example: list[Any]) -> Any:
        graphs.append(gm)
        raise _Traced

    torch._dynamo.reset()
    fn = torch.compile(attn8.attention8, fullgraph=True, backend=capture)
    q, k, v = (t.to(torch.bfloat16) for t in _qkv(tokens=16))
    with pytest.raises(Exception, match="_Traced"):  # dynamo wraps what a backend raises
        fn(q, k, v, "cudnn")
    assert len(graphs) == 1
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert targets.count("framefleet_attn.attn8_cudnn") == 1
    assert not any("scaled_dot_product" in t for t in targets)
