"""Attention and GEMM kernels at the Wan shapes: what a denoise step is made of, per kernel.

Per shape (heads x 128 at the token counts of the real sizes: the 5B at 1280x704x121 and
832x480x49, the 1.3B at 832x480x81, the 14B at 1280x720x81) it times every attention kernel
this machine has, each against a float32 reference on the first ``CHECK_HEADS`` heads (rel L2):

  default        torch's ``scaled_dot_product_attention`` as it picks
  cudnn, flash,  one SDPA kernel each (``worker.generate.tier.attnproc.exact_attention``);
  efficient      math too with ``--tiny`` (it holds the whole score matrix)
  flash-FA3/FA4  flash after ``torch.nn.attention.activate_flash_attention_impl``, where that
                 activates (the JSON records why not)
  attn8:cudnn    the fp8 tier's 8-bit attention (``worker.generate.tier.attn8``): quantise +
                 cuDNN's float8 kernel, compiled as in the tier (``--compile``), and the kernel
                 alone on inputs quantised beforehand (``attn8:cudnn kernel``)
  attn8:reference  the same arithmetic in plain torch (``--tiny``: the CPU's stand-in)
  sageattn       SageAttention, where the package is installed

and the GEMMs of a block (27,280 tokens x 3072 -> 3072 / 14,336 and back; the 14B's FFN): bf16,
float8 rowwise ``_scaled_mm`` on operands quantised beforehand, and float8 with the activation's
quantisation compiled in front of it (``--compile``), errors against float32. The matrix units'
peaks are measured in the same run (an 8192^3 product in bf16 and in float8) so each kernel's
TFLOP/s can be read against them. Attention FLOPs: 4·heads·tokens²·128.

``--forward MODEL``: a whole transformer forward with the 8-bit attention against exact
(attn_forward.py).

  python bench/generate/attention.py --compile --forward wan2.2-ti2v-5b \
      --json attention-h100.json --out DIR                                  # CUDA
  python bench/generate/attention.py --tiny --compile --forward x --out DIR    # CPU (CI)
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.report import device_report, write_json
from worker.generate.tier import attn8, cudnn8
from worker.generate.tier.attnproc import exact_attention

SHAPES = [("wan2.2-5b 1280x704x121", 24, 27280), ("wan2.2-5b 832x480x49", 24, 5070),
          ("wan2.1-1.3b 832x480x81", 12, 32760), ("wan2.1-14b 1280x720x81", 40, 75600)]
TINY_SHAPES = [("tiny", 2, 320)]
GEMMS = [("5b qkvo", 27280, 3072, 3072), ("5b ffn up", 27280, 3072, 14336),
         ("5b ffn down", 27280, 14336, 3072), ("14b ffn up", 75600, 5120, 13824)]
TINY_GEMMS = [("tiny", 320, 64, 128)]
HEAD_DIM, TINY_HEAD_DIM = 128, 64
CHECK_HEADS = 2
#: Query rows per chunk of the float32 reference (bounds its score matrix).
REF_CHUNK = 4096


def timed(fn: Callable[[], Any], device: torch.device, reps: int) -> float:
    """Median seconds of ``fn`` over ``reps`` runs after two warm-ups (CUDA events on CUDA)."""
    fn()
    fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """float32 attention of the first ``CHECK_HEADS`` heads, (b, s, h, d), in query chunks."""
    q, k, v = (t[:, :, :CHECK_HEADS].float().transpose(1, 2) for t in (q, k, v))
    out = []
    for i in range(0, q.shape[2], REF_CHUNK):
        s = q[:, :, i:i + REF_CHUNK] @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
        out.append(torch.softmax(s, dim=-1) @ v)
    return torch.cat(out, dim=2).transpose(1, 2)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    got = out[:, :, :CHECK_HEADS].float()
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


def flash_impls() -> dict[str, str | None]:
    """Each flash impl torch lists: None where it activates, else why not."""
    import torch.nn.attention as A

    found: dict[str, str | None] = {}
    for impl in getattr(A, "list_flash_attention_impls", lambda: [])():
        try:
            A.activate_flash_attention_impl(impl)
            found[impl] = None
        except Exception as e:  # noqa: BLE001 - any failure is a finding, recorded
            found[impl] = f"{type(e).__name__}: {str(e)[:300]}"
        finally:
            try:
                A.restore_flash_attention_impl()
            except Exception:  # noqa: BLE001 - nothing was activated
                pass
    return found


def sage() -> Callable[..., Any] | None:
    try:
        from sageattention import sageattn
    except Exception:  # noqa: BLE001 - not installed (or not importable here)
        return None
    return sageattn  # type: ignore[no-any-return]


def kernels(args: argparse.Namespace, device: torch.device,
            impls: dict[str, str | None]) -> dict[str, Callable[..., Any]]:
    """name -> f(q, k, v) on (b, s, h, d) bfloat16, for what this machine has."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    found: dict[str, Callable[..., Any]] = {
        "default": lambda q, k, v: sdpa(*(t.transpose(1, 2) for t in (q, k, v))).transpose(1, 2)}
    for backend in ("cudnn", "flash", "efficient") if device.type == "cuda" else ("math",):
        found[backend] = lambda q, k, v, b=backend: exact_attention(q, k, v, b)
    for impl, why in impls.items():
        if why is None:
            found[f"flash-{impl}"] = lambda q, k, v: exact_attention(q, k, v, "flash")
    eight = "cudnn" if device.type == "cuda" and cudnn8.available() is None else "reference"
    if device.type == "cuda" and eight == "reference":
        return found  # the reference at these sizes is no kernel: no 8-bit row
    full = (torch.compile(attn8.attention8, fullgraph=True, dynamic=False) if args.compile
            else attn8.attention8)
    found[f"attn8:{eight}"] = lambda q, k, v: full(q, k, v, eight)
    run = sage()
    if run is not None and device.type == "cuda":
        found["sageattn"] = lambda q, k, v: run(q, k, v, tensor_layout="NHD", is_causal=False)
    return found


def attention_rows(args: argparse.Namespace, device: torch.device, doc: dict[str, Any]) -> None:
    for name, heads, tokens in TINY_SHAPES if args.tiny else SHAPES:
        shape_rows(args, device, doc, name, heads, tokens)
        if device.type == "cuda":
            torch.cuda.empty_cache()


def shape_rows(args: argparse.Namespace, device: torch.device, doc: dict[str, Any], name: str,
               heads: int, tokens: int) -> None:
    """Every kernel at one shape (and cuDNN's float8 kernel alone, where it runs)."""
    d = TINY_HEAD_DIM if args.tiny else HEAD_DIM
    g = torch.Generator(device).manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    q, k, v = (torch.randn(1, tokens, heads, d, generator=g, device=device, dtype=dtype)
               for _ in range(3))
    ref = reference(q, k, v)
    flops = 4 * heads * tokens * tokens * d
    for label, fn in kernels(args, device, doc["flash_impls"]).items():
        row: dict[str, Any] = {"shape": name, "heads": heads, "tokens": tokens, "kernel": label}
        try:
            if label.startswith("flash-"):
                torch.nn.attention.activate_flash_attention_impl(label.split("-")[1])
            row["rel_err"] = rel_err(fn(q, k, v), ref)
            row["ms"] = timed(functools.partial(fn, q, k, v), device, args.reps) * 1e3
            row["tflops"] = flops / row["ms"] / 1e9
        except Exception as e:  # noqa: BLE001 - a kernel that fails here is a finding
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        finally:
            if label.startswith("flash-"):
                torch.nn.attention.restore_flash_attention_impl()
        doc["attention"].append(row)
        print(json.dumps(row), flush=True)
    if device.type == "cuda" and cudnn8.available() is None:
        doc["attention"].append(kernel_only(q, k, v, ref, name, heads, tokens, flops, args))


def kernel_only(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ref: torch.Tensor,
                name: str, heads: int, tokens: int, flops: int,
                args: argparse.Namespace) -> dict[str, Any]:
    """cuDNN's float8 kernel alone, on operands quantised beforehand (no smoothing)."""
    (q8, dq), (k8, dk), (v8, dv) = (attn8.quantise(t) for t in (q, k, v))
    scale = q.shape[-1] ** -0.5

    def run() -> torch.Tensor:
        return torch.ops.framefleet_attn.attn8_cudnn(q8, k8, v8, dq, dk, dv, scale)

    row: dict[str, Any] = {"shape": name, "heads": heads, "tokens": tokens,
                           "kernel": "attn8:cudnn kernel"}
    try:
        row["rel_err"] = rel_err(run().float() * dv, ref)  # the kernel writes o / descale_v
        row["ms"] = timed(run, q.device, args.reps) * 1e3
        row["tflops"] = flops / row["ms"] / 1e9
    except Exception as e:  # noqa: BLE001
        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    print(json.dumps(row), flush=True)
    return row


def rowwise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float8 e4m3 per row (the fp8 tier's linears: torchao's PerRow), with its scales."""
    amax = x.abs().amax(dim=-1, keepdim=True).float().clamp_min(attn8.AMAX_LB)
    scale = amax / attn8.E4M3_MAX
    return (x.float() / scale).clamp(-attn8.E4M3_MAX, attn8.E4M3_MAX).to(attn8.F8), scale


def gemm_rows(args: argparse.Namespace, device: torch.device, doc: dict[str, Any]) -> None:
    for name, m, k, n in TINY_GEMMS if args.tiny else GEMMS:
        doc["gemms"].append(gemm_row(args, device, name, m, k, n))
        print(json.dumps(doc["gemms"][-1]), flush=True)


def gemm_row(args: argparse.Namespace, device: torch.device, name: str, m: int, k: int,
             n: int) -> dict[str, Any]:
    """One GEMM of a block in bf16, in float8 rowwise, and in float8 behind its quantisation."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    g = torch.Generator(device).manual_seed(0)
    x = torch.randn(m, k, generator=g, device=device, dtype=dtype)
    w = torch.randn(n, k, generator=g, device=device, dtype=dtype) / k**0.5
    ref = x[:1024].float() @ w.float().t()
    wq, ws = rowwise(w)
    xq, xs = rowwise(x)

    def fp8(xq: torch.Tensor, xs: torch.Tensor) -> torch.Tensor:
        return torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws.t(),
                                out_dtype=torch.bfloat16)

    def quant_fp8(x: torch.Tensor) -> torch.Tensor:
        return fp8(*rowwise(x))

    fused = torch.compile(quant_fp8, fullgraph=True, dynamic=False) if args.compile \
        else quant_fp8
    row: dict[str, Any] = {"gemm": name, "m": m, "k": k, "n": n}
    for label, fn in (("bf16", lambda: x @ w.t()), ("fp8", lambda: fp8(xq, xs)),
                      ("fp8+quantise", lambda: fused(x))):
        try:
            t = timed(fn, device, args.reps)
            row[f"{label}_ms"] = t * 1e3
            row[f"{label}_tflops"] = 2 * m * k * n / t / 1e12
            row[f"{label}_rel_err"] = float((fn()[:1024].float() - ref).norm() / ref.norm())
        except Exception as e:  # noqa: BLE001 - a kernel missing here is a finding
            row[f"{label}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    return row


def peaks(args: argparse.Namespace, device: torch.device) -> dict[str, float]:
    """The matrix units' TFLOP/s on an n^3 product of random data, bf16 and float8."""
    n = 512 if args.tiny else 8192
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    (aq, sa), (bq, sb) = rowwise(a), rowwise(b)
    found = {"bf16_tflops": 2 * n**3 / timed(lambda: a @ b.t(), device, args.reps) / 1e12}
    try:
        found["fp8_tflops"] = 2 * n**3 / timed(lambda: torch._scaled_mm(
            aq, bq.t(), scale_a=sa, scale_b=sb.t(), out_dtype=torch.bfloat16),
            device, args.reps) / 1e12
    except RuntimeError as e:
        print(f"fp8 peak: {e}", flush=True)
    return found


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="CPU-sized shapes (CI)")
    ap.add_argument("--compile", action="store_true",
                    help="the 8-bit attention's and the fp8 GEMM's quantisation compiled, as in "
                    "the tier (torch.compile, fullgraph)")
    ap.add_argument("--forward", default=None, metavar="MODEL",
                    help="also a whole transformer forward of this preset with the 8-bit "
                    "attention against exact (attn_forward.py; --tiny: tiny-ti2v)")
    ap.add_argument("--reps", type=int, default=None, help="timed runs (default 6; --tiny 3)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--json", default="attention.json", help="file name under --out")
    ap.add_argument("--out", required=True, help="folder for the JSON and markdown")
    args = ap.parse_args()
    args.reps = args.reps or (3 if args.tiny else 6)
    args.forward = args.forward and ("tiny-ti2v" if args.tiny else args.forward)
    return args


def main() -> int:
    from bench.generate.attn_report import attention_markdown

    args = parse_args()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {
        "command": " ".join(["python", *sys.argv]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), **device_report(device),
        "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
        "attn8_cudnn": cudnn8.available() or "available",
        "sageattention": sage() is not None, "flash_impls": flash_impls(),
        "peaks": peaks(args, device), "attention": [], "gemms": [], "forward": []}
    print(json.dumps({k: doc[k] for k in ("device", "cudnn", "attn8_cudnn", "sageattention",
                                          "flash_impls", "peaks")}), flush=True)
    attention_rows(args, device, doc)
    write_json(out / args.json, doc)
    gemm_rows(args, device, doc)
    write_json(out / args.json, doc)
    if args.forward:
        from bench.generate.attn_forward import forward_rows

        eight = "cudnn" if device.type == "cuda" and cudnn8.available() is None else "reference"
        doc["forward"] = forward_rows(args.forward, device, eight)
        print(json.dumps(doc["forward"]), flush=True)
        write_json(out / args.json, doc)
    text = attention_markdown(doc)
    (out / Path(args.json).with_suffix(".md").name).write_text(text)
    print(text)
    failed = [r for r in doc["attention"] if "error" in r and not r["kernel"].startswith(
        ("flash-", "sage"))] + [r for r in doc["forward"] if not r["finite"]]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
