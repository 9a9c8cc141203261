"""The fp8 tier leaves inductor's process-wide config alone (worker/generate/tier/tiers.py).

torchao's float8 transform, by default, sets inductor's config for the whole process
(coordinate-descent tuning in every direction ...). A worker that made an fp8 copy then
compiled every later graph, the exact tier's too, that way: slower, and under other FX graph
cache keys than the compile artifacts and the cache that a process without an fp8 copy
filled. The fp8 blocks get those options in their own compile instead."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

pytest.importorskip("torchao")
import torch._inductor.config as inductor_config

from worker.generate.tier.tiers import fp8_config


@pytest.fixture
def restored() -> Iterator[None]:
    saved = inductor_config.save_config()
    yield
    inductor_config.load_config(saved)


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 16)).to(
        torch.bfloat16)


def _quantise(config: object) -> None:
    """torchao's float8 transform; on the CPU its hardware check stops it, after the step
    that sets inductor's config (the step this test is about)."""
    from torchao.quantization import quantize_

    try:
        quantize_(_model(), config)
    except AssertionError as e:
        assert "compute capability" in str(e)


def test_quantising_an_fp8_copy_changes_no_other_compile(restored: None) -> None:
    # Given inductor's defaults (another test of this process may have quantised with
    # torchao's own defaults; ``restored`` puts back what it found)
    inductor_config.coordinate_descent_tuning = False
    inductor_config.coordinate_descent_check_all_directions = False
    before = inductor_config.save_config_portable()
    # When the tier quantises a model
    _quantise(fp8_config())
    # Then inductor's config, and with it every other graph's cache key, is as it was
    assert inductor_config.save_config_portable() == before
    assert not inductor_config.coordinate_descent_tuning
    # (torchao's own default does change it: what the worker's soak ran into)
    _quantise(type(fp8_config())(granularity=fp8_config().granularity))
    assert inductor_config.coordinate_descent_tuning
    assert inductor_config.save_config_portable() != before
