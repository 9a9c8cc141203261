"""``generate.py --split``: a tier's transformer forward by kernel class (attention, GEMM,
other), so the report shows what each tier's step is made of and what is left to gain.

One forward of the resident transformer at the row's size (the size its rows compiled: the
tier's own kernels, its quantisation fused as it runs), under torch's profiler: on CUDA each
kernel's device time, on the CPU each op's own time (the reference 8-bit attention is plain
torch there, so its products count as GEMM). A forward is half a step with CFG (two a step);
the shares are the step's. Kernel names are classified by ``classify``.
"""

from __future__ import annotations

from typing import Any

import torch

from bench.generate.gen_runs import on_device
from worker.generate.conditions.text import MAX_SEQUENCE_LENGTH

#: Substrings of attention kernels and ops (checked first: cuDNN's attention kernels also
#: name the matrix instructions they use).
ATTENTION = ("sdpa", "attention", "fmha", "flash", "attn8", "sageattn", "attn_fwd")
#: Substrings of matrix-product kernels and ops: cuBLAS(Lt)'s, CUTLASS's, torch's.
GEMM = ("gemm", "nvjet", "cutlass", "xmma", "matmul", "scaled_mm", "f8f8", "aten::mm",
        "aten::bmm", "aten::addmm", "aten::baddbmm", "_tem_fused")


def classify(name: str) -> str:
    """``attention``, ``gemm`` or ``other`` for a kernel's or an op's name."""
    low = name.lower()
    if any(s in low for s in ATTENTION):
        return "attention"
    if any(s in low for s in GEMM):
        return "gemm"
    return "other"


def _inputs(transformer: Any, size: tuple[int, int, int], info: Any,
            device: torch.device) -> dict[str, Any]:
    h, w, f = size
    cfg = transformer.config
    g = torch.Generator("cpu").manual_seed(0)
    lat = torch.randn(1, cfg.in_channels, (f - 1) // info.temporal_factor + 1,
                      h // info.spatial_factor, w // info.spatial_factor, generator=g)
    text = torch.randn(1, MAX_SEQUENCE_LENGTH, cfg.text_dim, generator=g)
    dtype = transformer.dtype  # the model's (a module kept in float32 may come first)
    return {"hidden_states": lat.to(device, dtype), "timestep": torch.tensor([500], device=device),
            "encoder_hidden_states": text.to(device, dtype), "return_dict": False}


@on_device("kernel split")
@torch.no_grad()
def split(transformer: Any, size: tuple[int, int, int], info: Any,
          device: torch.device) -> dict[str, Any]:
    """One forward's time by kernel class: ``ms`` and ``share`` per class, ``total_ms``, and
    the largest kernels (``top``)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    args = _inputs(transformer, size, info, device)
    transformer(**args)  # the size is compiled by the rows already: this only warms
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        transformer(**args)
        if cuda:
            torch.cuda.synchronize(device)
    ms = {"attention": 0.0, "gemm": 0.0, "other": 0.0}
    kernels: dict[str, float] = {}
    for event in prof.key_averages():
        if cuda and event.device_type != DeviceType.CUDA:
            continue
        us = event.self_device_time_total if cuda else event.self_cpu_time_total
        if us <= 0:
            continue
        ms[classify(event.key)] += us / 1e3
        kernels[event.key] = kernels.get(event.key, 0.0) + us / 1e3
    total = sum(ms.values()) or 1.0
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:8]
    return {"total_ms": total, "ms": ms, "share": {c: t / total for c, t in ms.items()},
            "time": "device" if cuda else "cpu",
            "top": [{"kernel": k[:120], "class": classify(k), "ms": t} for k, t in top]}
