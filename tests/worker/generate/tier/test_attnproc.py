"""The tiers' attention processor on a Wan transformer (CPU): ``stock`` is diffusers' own bit
for bit, an exact backend is the same attention, the 8-bit attention (reference kernel) runs
only on the fp8 tier's transformer with a small, real error, the compiled blocks hold it with
``fullgraph`` (no graph break), and installing twice or touching cross-attention changes
nothing."""

from __future__ import annotations

from typing import Any

import torch

from worker.generate.tier import attnproc, tiers

CONFIG = {"num_attention_heads": 2, "attention_head_dim": 16, "in_channels": 16,
          "out_channels": 16, "ffn_dim": 64, "num_layers": 2, "text_dim": 32, "freq_dim": 256,
          "rope_max_seq_len": 32}


def _transformer() -> Any:
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    return WanTransformer3DModel(**CONFIG).eval().requires_grad_(False)


def _inputs(seed: int = 1) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {"hidden_states": torch.randn(1, 16, 3, 8, 8, generator=g),
            "timestep": torch.tensor([500]),
            "encoder_hidden_states": torch.randn(1, 16, 32, generator=g), "return_dict": False}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@torch.no_grad()
def test_each_mode_against_diffusers() -> None:
    model, args = _transformer(), _inputs()
    ref = model(**args)[0]
    mode = attnproc.Mode()
    assert attnproc.install(model, mode, eight=True) == 2
    assert torch.equal(model(**args)[0], ref)  # stock: diffusers' processor, bit for bit
    mode.exact = "math"
    assert _rel(model(**args)[0], ref) < 1e-5  # the same attention through one kernel
    mode.attn8 = "reference"
    err = _rel(model(**args)[0], ref)
    assert 1e-4 < err < 5e-2  # float8 rounding, a real and small error
    other = _inputs(seed=2)  # and on another input, the same order
    eight = model(**other)[0]
    mode.attn8, mode.exact = None, "stock"
    assert 1e-4 < _rel(eight, model(**other)[0]) < 5e-2


@torch.no_grad()
def test_the_8_bit_attention_is_the_fp8_tiers_only() -> None:
    model, args = _transformer(), _inputs()
    ref = model(**args)[0]
    attnproc.install(model, attnproc.Mode(attn8="reference"), eight=False)  # the exact tier
    assert torch.equal(model(**args)[0], ref)


def test_installing_twice_keeps_diffusers_processor_and_cross_attention() -> None:
    model = _transformer()
    stock = [b.attn1.processor for b in model.blocks]
    cross = [b.attn2.processor for b in model.blocks]
    attnproc.install(model, attnproc.Mode(), eight=False)
    mode = attnproc.Mode(attn8="reference")
    attnproc.install(model, mode, eight=True)
    for block, first, second in zip(model.blocks, stock, cross, strict=True):
        assert isinstance(block.attn1.processor, attnproc.TierAttention)
        assert block.attn1.processor.stock is first and block.attn1.processor.mode is mode
        assert block.attn2.processor is second


@torch.no_grad()
def test_compiled_blocks_hold_the_8_bit_attention_without_a_graph_break() -> None:
    torch._dynamo.reset()
    model, args = _transformer(), _inputs()
    attnproc.install(model, attnproc.Mode(attn8="reference"), eight=True)
    eager = model(**args)[0]
    assert tiers.compile_blocks(model, backend="aot_eager") == 2  # fullgraph=True
    compiled = model(**args)[0]
    assert _rel(compiled, eager) < 1e-5
    torch._dynamo.reset()


@torch.no_grad()
def test_a_short_sequence_keeps_exact_attention_where_cudnn_is_chosen() -> None:
    """Below ``CUDNN_MIN_TOKENS`` the quantisation would cost more than the 8-bit kernel saves
    (measured on an H100): the processor runs the exact path, cuDNN's op is never called."""
    model, args = _transformer(), _inputs()  # 48 tokens
    ref = model(**args)[0]
    attnproc.install(model, attnproc.Mode(attn8="cudnn"), eight=True)
    assert torch.equal(model(**args)[0], ref)
