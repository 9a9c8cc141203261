"""cuDNN's float8 attention (``SDPA_fp8``) as a torch custom op: ``framefleet_attn::attn8_cudnn``.

The fp8 tier's 8-bit attention kernel on Hopper and later (``worker.generate.tier.attn8``):
Q, K and V in float8 e4m3 with one descale each, the softmax's P rounded to float8 inside the
kernel (scale ``P_SCALE``), products accumulated in float32, the output written in float8 too:
cuDNN 9.19 writes bfloat16 from float8 attention on Blackwell only ("sdpa fp8 forward with
HALF/BFLOAT16 output is only supported on Blackwell", seen on an H100). The output's scale is
V's (an attention output is a convex mix of V's rows, so it never exceeds V's largest value):
``scale_o = 1 / descale_v``, and the caller multiplies by ``descale_v`` (inside the compiled
graph, fused with what follows). The fp8 tier's output projection quantises its input to
float8 again in any case. It is reached through the cuDNN frontend's
Python graph API (``nvidia-cudnn-frontend``, the ``attention8`` extra), which loads the cuDNN
library torch already ships.

A custom op, not a Python call, so that the attention stays inside the compiled blocks:
dynamo sees one opaque node with a fake implementation (its output's shape and dtype), no
graph break, and inductor fuses the quantisation around it. The real implementation runs on
the current CUDA stream; one cuDNN graph is built per (shape, strides, scale, device) and
reused, as are the handle per device and the constant scale tensors.

Layout: ``(batch, tokens, heads, head_dim)`` in and out, as diffusers' Wan attention hands
them; cuDNN is told those strides, so nothing is transposed or copied.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

#: The float8 scale of the softmax's P (unnormalised, in [0, 1]): a power of two, so its
#: descale is exact. Kept here and in ``attn8`` (the reference imports it from there).
P_SCALE = 256.0

_LOCK = threading.Lock()
_GRAPHS: dict[tuple[Any, ...], Any] = {}
_HANDLES: dict[int, Any] = {}
_CONSTANTS: dict[int, dict[str, torch.Tensor]] = {}


def available() -> str | None:
    """Why this process cannot run the op (None: it can, as far as imports and the GPU go;
    ``attnchoice`` still runs it once against the reference before a tier uses it)."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    if torch.cuda.get_device_capability() < (9, 0):
        return "cuDNN's float8 attention needs compute capability 9.0 or more"
    try:
        import cudnn
    except ImportError as e:
        return f"nvidia-cudnn-frontend is not installed (the attention8 extra): {e}"
    if cudnn.backend_version() < 91400:
        return f"cuDNN {cudnn.backend_version()} is older than 9.14"
    return None


def _bhsd(t: torch.Tensor) -> tuple[list[int], list[int]]:
    """cuDNN's (b, h, s, d) dims and strides of a (b, s, h, d) tensor."""
    b, s, h, d = t.shape
    st = t.stride()
    return [b, h, s, d], [st[0], st[2], st[1], st[3]]


def _handle(device: torch.device) -> Any:
    import cudnn

    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _HANDLES:
        with torch.cuda.device(index):
            _HANDLES[index] = cudnn.create_handle()
    handle = _HANDLES[index]
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream(device).cuda_stream)
    return handle


def _constants(device: torch.device) -> dict[str, torch.Tensor]:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _CONSTANTS:
        def one(value: float) -> torch.Tensor:
            return torch.full((1, 1, 1, 1), value, dtype=torch.float32, device=device)

        _CONSTANTS[index] = {"descale_s": one(1 / P_SCALE), "scale_s": one(P_SCALE),
                             "amax_s": one(0.0), "amax_o": one(0.0)}
    return _CONSTANTS[index]


def _build(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
           scale: float) -> Any:
    import cudnn

    f8, f32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
    g = cudnn.pygraph(io_data_type=f8, intermediate_data_type=f32, compute_data_type=f32,
                      handle=_handle(q.device))
    tensors = {}
    for name, t in (("q", q), ("k", k), ("v", v)):
        dim, stride = _bhsd(t)
        tensors[name] = g.tensor(name=name, dim=dim, stride=stride, data_type=f8)
    for name in ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o"):
        tensors[name] = g.tensor(name=name, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=f32)
    o, _, amax_s, amax_o = g.sdpa_fp8(
        q=tensors["q"], k=tensors["k"], v=tensors["v"], descale_q=tensors["descale_q"],
        descale_k=tensors["descale_k"], descale_v=tensors["descale_v"],
        descale_s=tensors["descale_s"], scale_s=tensors["scale_s"], scale_o=tensors["scale_o"],
        generate_stats=False, attn_scale=scale, use_causal_mask=False)
    dim, stride = _bhsd(out)
    o.set_output(True).set_dim(dim).set_stride(stride).set_data_type(f8)
    for amax in (amax_s, amax_o):
        amax.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(f32)
    tensors.update(o=o, amax_s=amax_s, amax_o=amax_o)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    return g, tensors, g.get_workspace_size()


@torch.library.custom_op("framefleet_attn::attn8_cudnn", mutates_args=())
def attn8_cudnn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, descale_q: torch.Tensor,
                descale_k: torch.Tensor, descale_v: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(q·kᵀ·scale)·v / descale_v from float8 (b, s, h, d) tensors and their
    (1, 1, 1, 1) float32 descales: float8 (b, s, h, d), contiguous (times ``descale_v``: the
    attention)."""
    out = torch.empty(q.shape, dtype=torch.float8_e4m3fn, device=q.device)
    key = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), scale, q.device)
    with _LOCK:
        built = _GRAPHS.get(key)
        if built is None:
            built = _GRAPHS[key] = _build(q, k, v, out, scale)
    graph, t, workspace_bytes = built
    consts = _constants(q.device)
    pack = {t["q"]: q, t["k"]: k, t["v"]: v, t["descale_q"]: descale_q,
            t["descale_k"]: descale_k, t["descale_v"]: descale_v, t["o"]: out,
            t["scale_o"]: torch.reciprocal(descale_v),
            **{t[name]: consts[name] for name in consts}}
    workspace = torch.empty(max(workspace_bytes, 1), dtype=torch.uint8, device=q.device)
    graph.execute(pack, workspace, handle=_handle(q.device))
    return out


@attn8_cudnn.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, descale_q: torch.Tensor,
      descale_k: torch.Tensor, descale_v: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.empty(q.shape, dtype=torch.float8_e4m3fn, device=q.device)
