"""The fast path on a GPU: every shard read on its thread's own CUDA stream lands as the very
tensors diffusers' ``from_pretrained(dtype=...).to("cuda")`` gives, bit for bit (the copies
and casts of several threads' streams, synchronised before anyone reads them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.worker.generate.model.test_published import published  # noqa: F401 (fixture)
from tests.worker.generate.published import PUBLISHED
from worker import quiet
from worker.generate.model.fastload import MODELS, load_pipeline

pytestmark = pytest.mark.gpu


def _tensors(module: Any) -> dict[str, torch.Tensor]:
    return {**dict(module.named_parameters()), **dict(module.named_buffers())}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_the_fast_path_loads_to_cuda_what_diffusers_loads(published: dict[str, Path],  # noqa: F811
                                                         name: str) -> None:
    import diffusers

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    folder, layout = published[name], PUBLISHED[name]
    cuda = torch.device("cuda")
    ref = getattr(diffusers, layout.pipeline).from_pretrained(
        str(folder), **quiet.dtype_kwargs(torch.bfloat16)).to(cuda)
    pipe, _ = load_pipeline(folder, layout.pipeline, torch.bfloat16, cuda, 4)
    for component in MODELS:
        a, b = getattr(ref, component, None), getattr(pipe, component, None)
        if a is None or b is None:
            assert a is None and b is None, component
            continue
        want, got = _tensors(a), _tensors(b)
        assert want.keys() == got.keys()
        for key, tensor in want.items():
            assert got[key].device == tensor.device and got[key].dtype == tensor.dtype, key
            assert torch.equal(got[key], tensor), (component, key)
