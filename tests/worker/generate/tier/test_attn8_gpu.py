"""cuDNN's float8 attention on a GPU against the reference that stands in for it on the CPU:
the same arithmetic up to the order of its sums (online softmax in blocks against one row
maximum), compiled inside a graph as the tier runs it, and the worker's measurement choosing it."""

from __future__ import annotations

import pytest
import torch

from worker.generate.tier import attn8, attnchoice, cudnn8
from worker.generate.tier.attnproc import exact_attention

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _cudnn_float8() -> None:
    why = cudnn8.available()
    if why is not None:
        pytest.skip(why)


def _qkv(tokens: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator("cuda").manual_seed(seed)
    return [torch.randn(1, tokens, 4, 128, generator=g, device="cuda", dtype=torch.bfloat16)
            for _ in range(3)]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("tokens,seed", [(8192, 0), (9000, 1)])  # 9000: not a multiple of 128
def test_cudnn_float8_attention_is_the_reference(tokens: int, seed: int) -> None:
    q, k, v = _qkv(tokens, seed)
    exact = exact_attention(*(t.float() for t in (q, k, v)), "math")
    got = attn8.attention8(q, k, v, "cudnn")
    ref = attn8.attention8(q, k, v, "reference")
    assert torch.isfinite(got).all()
    assert _rel(got, ref) < 3e-2  # the same rounding, summed in another order
    assert _rel(got, exact) < 0.1
    compiled = torch.compile(attn8.attention8, fullgraph=True, dynamic=False)
    assert _rel(compiled(q, k, v, "cudnn"), got) < 1e-2


def test_the_measurement_chooses_it_here() -> None:
    choice = attnchoice.measure(torch.device("cuda"), heads=4, head_dim=128)
    assert choice.attn8 == "cudnn" and choice.why == ""
    assert choice.rel_err["attn8:cudnn"] < attnchoice.ATTN8_TOL
