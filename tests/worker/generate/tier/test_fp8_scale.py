"""Why the fp8 tier's videos were NaN, shown with torchao's own float8 primitives on the CPU,
and that the tier's config and layer filter keep zero rows finite.

``WanPipeline`` pads prompt embeddings with rows of zeros; torchao scales each row by
``amax / 448`` and a zero row divides 0 by 0. The float8 matrix product itself needs a GPU:
``tests/gpu/test_gpu_tiers.py`` runs the whole fp8 job there and checks it is finite."""

from __future__ import annotations

import pytest
import torch

torchao = pytest.importorskip("torchao")
from torchao.quantization.quant_primitives import (  # noqa: E402
    _choose_scale_float8,
    _quantize_affine_float8,
)

from worker.generate.tier.tiers import FP8_ACTIVATION_LB, fp8_config, fp8_linear  # noqa: E402


def _quantised(x: torch.Tensor, lb: float | None) -> torch.Tensor:
    scale = _choose_scale_float8(x, [1, x.shape[1]], torch.float8_e4m3fn, hp_value_lb=lb)
    return _quantize_affine_float8(x, scale, torch.float8_e4m3fn).float()


def test_a_zero_row_is_nan_without_the_floor_and_zeros_with_it() -> None:
    # Given prompt embeddings padded with rows of zeros, as WanPipeline's are
    x = torch.randn(6, 64, dtype=torch.bfloat16)
    x[3:] = 0
    # When torchao's per-row float8 quantises them without a floor, the zero rows are NaN
    assert _quantised(x, None)[3:].isnan().all()
    # Then with the tier's floor they are zeros, and every other row is unchanged
    floored = _quantised(x, FP8_ACTIVATION_LB)
    assert torch.isfinite(floored).all() and (floored[3:] == 0).all()
    assert torch.equal(floored[:3], _quantised(x[:3], None))


def test_the_tier_config_floors_activation_scales() -> None:
    config = fp8_config()
    assert config.activation_value_lb == FP8_ACTIVATION_LB
    assert [type(g).__name__ for g in config.granularity] == ["PerRow", "PerRow"]


def test_a_weight_with_a_zero_row_stays_bf16() -> None:
    layer = torch.nn.Linear(16, 8).to(torch.bfloat16)
    assert fp8_linear(layer, "blocks.0.ffn")
    with torch.no_grad():
        layer.weight[5] = 0
    assert not fp8_linear(layer, "blocks.0.ffn")
    assert not fp8_linear(torch.nn.Linear(16, 8), "float32 layer")  # kept precise on purpose
