"""``attention.py --forward MODEL``: what the 8-bit attention costs a whole transformer forward.

One forward of MODEL's transformer (seeded random weights at the real architecture, the
preset's default size, timestep 500, random prompt embeddings), eager, against the exact tier's
eager forward (rel L2 of the output), with:

  attn8              the blocks' self-attention in 8 bits (the tier's processors, this GPU's
                     kernel: ``cudnn``; on the CPU the reference stands in), linears bf16
  fp8 linears        the fp8 tier as it was: torchao's float8 linears, attention bf16 (CUDA)
  fp8 linears+attn8  the fp8 tier now (CUDA)

With random weights these are the arithmetic's error, not a model's visual quality. Eager, so
no time is reported here: the kernels' times are the attention rows', the tiers' are
``generate.py``'s.
"""

from __future__ import annotations

import copy
import types
from typing import Any

import torch

from worker.generate.model.presets import PRESETS, cast
from worker.generate.tier import attnproc, tiers


def _transformer(name: str, device: torch.device, dtype: torch.dtype) -> Any:
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    with torch.device(device):
        model = cast(WanTransformer3DModel(**PRESETS[name].transformer), dtype)
    return model.eval().requires_grad_(False)


@torch.no_grad()
def forward_rows(name: str, device: torch.device, kernel: str) -> list[dict[str, Any]]:
    """The rows above for preset ``name`` (``kernel``: the 8-bit attention's)."""
    from bench.generate.gen_split import _inputs

    p = PRESETS[name]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    info = types.SimpleNamespace(temporal_factor=p.vae.get("scale_factor_temporal", 4),
                                 spatial_factor=p.vae.get("scale_factor_spatial", 8))
    model = _transformer(name, device, dtype)
    args = _inputs(model, p.default_size, info, device)
    ref = model(**args)[0].double()

    def row(what: str, out: torch.Tensor) -> dict[str, Any]:
        err = float((out.double() - ref).norm() / ref.norm())
        return {"model": name, "size": "x".join(map(str, p.default_size)), "forward": what,
                "kernel": kernel, "rel_l2_vs_exact": err,
                "finite": bool(torch.isfinite(out).all())}

    rows = []
    attnproc.install(model, attnproc.Mode(attn8=kernel), eight=True)
    rows.append(row("attn8", model(**args)[0]))
    if device.type == "cuda":
        fp8 = copy.deepcopy(model)
        attnproc.install(fp8, attnproc.Mode(), eight=True)  # stock: the fp8 tier as it was
        tiers.quantise_fp8(fp8)
        rows.append(row("fp8 linears", fp8(**args)[0]))
        attnproc.install(fp8, attnproc.Mode(attn8=kernel), eight=True)
        rows.append(row("fp8 linears+attn8", fp8(**args)[0]))
        del fp8
    del model
    return rows
