"""Decode-only benchmark for issue 8: how fast can the Wan2.1 VAE decode a clip?

Variants, on one seeded random-weight Wan2.1 VAE and one latent clip per size (the optimisations
added one at a time, then the combination and alternatives):
  diffusers          vae.decode(z) on the whole clip (eager; the reference speed)
  modules            diffusers' per-frame loop streamed (framefleet's decoder before issue 8)
  step               WanStep eager: history as tensors, spatial padding inside the conv
  +cudnn_bench       torch.backends.cudnn.benchmark on
  +channels_last     weights and latents in channels_last_3d
  +compile           torch.compile of the steady-state chunk (no graph)
  +graph             the compiled chunk captured in a CUDA graph
  graph_eager        a CUDA graph of the eager step (no compile)
  ...                see VARIANTS
  worker_fast_decoder  WanDecoder(graphs=1) as a worker runs it: eager first chunk, then the
                     graph over a channels-last copy of the weights; warm-up measured cold
Per variant: median ms per steady-state chunk (CUDA events), whole-clip wall (median of
--reps), frames/s, warm-up (compile + capture) seconds, peak GPU memory; correctness of the
frames against an fp32 reference (relative L2) and against the eager bf16 step (max |Δ| of
uint8 frames). Then batch 2 and 4 (several clips per chunk) for the fast path, and a profiler
kernel breakdown. Writes JSON; prints a markdown table.

  python bench/decode/decode.py --sizes 1280x720,832x480 --frames 81 --reps 5 --out decode.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.report import device_report, write_json
from worker.decoders.wan import WanDecoder, build_vae
from worker.decoders.wan_graph import ChunkGraphs, steady_caches
from worker.decoders.wan_step import WanStep, set_memory_format

CL = torch.channels_last_3d
CF = torch.contiguous_format


@dataclass(frozen=True)
class Variant:
    name: str
    cudnn_bench: bool = True
    channels_last: bool = False
    compile: bool = False
    graph: bool = False
    stack_time: bool = False


VARIANTS = [
    Variant("step", cudnn_bench=False),
    Variant("+cudnn_bench"),
    Variant("+channels_last", channels_last=True),
    Variant("+compile", channels_last=True, compile=True),
    Variant("+graph", channels_last=True, compile=True, graph=True),
    Variant("graph_eager", channels_last=True, graph=True),
    Variant("compile+graph_contiguous", compile=True, graph=True),
    Variant("compile+graph+stack_time", channels_last=True, compile=True, graph=True,
            stack_time=True),
]


class Clip:
    """One variant set up for one latent size: yields a clip's chunks."""

    def __init__(self, vae: Any, v: Variant, key: tuple[int, int, int, int, torch.dtype]) -> None:
        torch.backends.cudnn.benchmark = v.cudnn_bench
        self.fmt = CL if v.channels_last else CF
        set_memory_format(vae, self.fmt)
        self.step = WanStep(vae, stack_time=v.stack_time)
        self.fn: Callable[..., Any] = self.step.__call__
        self.graph = None
        t0 = time.perf_counter()
        if v.graph:
            graphs = ChunkGraphs(self.step, torch.device("cuda"), capacity=1, compile=v.compile,
                                 memory_format=self.fmt)
            self.graph = graphs.prepare(key)
            assert self.graph is not None, f"{v.name}: capture failed (see log)"
        elif v.compile:
            self.fn = torch.compile(self.step.__call__, fullgraph=True, dynamic=False)
            b, c, h, w, dtype = key
            caches = steady_caches(self.step, key, torch.device("cuda"), self.fmt)
            z = torch.zeros((b, c, 1, h, w), device="cuda", dtype=dtype).contiguous(
                memory_format=self.fmt)
            with torch.inference_mode():
                for _ in range(3):
                    self.fn(z, caches)
        torch.cuda.synchronize()
        self.warmup_s = time.perf_counter() - t0

    @torch.inference_mode()
    def chunks(self, z: torch.Tensor, events: list[Any] | None = None) -> Iterator[torch.Tensor]:
        z = z.to("cuda", non_blocking=True).contiguous(memory_format=self.fmt)
        out, caches = self.step(z[:, :, :1])
        yield out
        if self.graph is not None:
            self.graph.load(caches)
        for i in range(1, z.shape[2]):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            if self.graph is not None:
                out = self.graph.step(z[:, :, i : i + 1])
            else:
                out, caches = self.fn(z[:, :, i : i + 1], caches)
            e.record()
            if events is not None:
                events.append((s, e))
            yield out


def timed(run: Callable[[list[Any]], None], reps: int) -> dict[str, Any]:
    walls, ms = [], []
    torch.cuda.reset_peak_memory_stats()
    for _ in range(reps):
        events: list[Any] = []
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        run(events)
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
        ms += [s.elapsed_time(e) for s, e in events]
    return {"wall_s": statistics.median(walls), "walls_s": walls,
            "chunk_ms": statistics.median(ms) if ms else None,
            "peak_gpu_mib": torch.cuda.max_memory_allocated() / 2**20}


def frames_of(chunks: Iterator[torch.Tensor]) -> torch.Tensor:
    return torch.cat([c.float() for c in chunks], dim=2)


def to_uint8(x: torch.Tensor) -> torch.Tensor:
    return ((x.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)


def compare(out: torch.Tensor, ref32: torch.Tensor, eager: torch.Tensor) -> dict[str, float]:
    return {"rel_l2_vs_fp32": float((out - ref32).norm() / ref32.norm()),
            "rel_l2_vs_eager_bf16": float((out - eager).norm() / eager.norm()),
            "max_abs_uint8_vs_eager_bf16":
                int((to_uint8(out).int() - to_uint8(eager).int()).abs().max()),
            "finite": bool(torch.isfinite(out).all())}


def bench_size(args: argparse.Namespace, size: str, vae: Any, vae32: Any) -> dict[str, Any]:
    w, h = (int(v) for v in size.split("x"))
    t = (args.frames - 1) // 4 + 1
    dtype = vae.dtype
    gen = torch.Generator().manual_seed(1)
    z = torch.randn(1, 16, t, h // 8, w // 8, generator=gen).to(dtype)
    key = (1, 16, h // 8, w // 8, dtype)
    rows: list[dict[str, Any]] = []
    errors: list[dict[str, str]] = []
    # fp32 reference: the eager step in true fp32 (no TF32 in cuDNN).
    torch.backends.cudnn.allow_tf32 = False
    set_memory_format(vae32, CF)
    ref32 = frames_of(Clip(vae32, Variant("fp32", cudnn_bench=False), key).chunks(z.float()))
    torch.backends.cudnn.allow_tf32 = True
    eager = frames_of(Clip(vae, VARIANTS[0], key).chunks(z))

    set_memory_format(vae, CF)
    torch.backends.cudnn.benchmark = False
    zc = z.to("cuda")
    with torch.inference_mode():
        diff = vae.decode(zc).sample.float()
        r = timed(lambda ev: vae.decode(zc), args.reps)
    rows.append({"variant": "diffusers", **r, **compare(diff, ref32, eager)})
    dec = WanDecoder(vae, "cuda", graphs=0)
    mods = frames_of(c[None] for c in dec._stream_modules(z[0]))
    r = timed(lambda ev: [None for _ in dec._stream_modules(z[0])], args.reps)
    rows.append({"variant": "modules", **r, **compare(mods, ref32, eager)})
    # The worker's own decoder: eager first chunk, then the compiled graph over its
    # channels-last weight copy. First compile of this size in the process: a cold warm-up.
    fast = WanDecoder(vae, "cuda", graphs=1)
    t0 = time.perf_counter()
    fast.warmup(h // 8, w // 8)
    warm = time.perf_counter() - t0
    if fast.graphs is not None:  # the first-chunk graph's build: never beside a timed decode
        fast.graphs.wait(timeout=900)
    out = frames_of(c[None] for c in fast.stream(z[0]))
    r = timed(lambda ev, d=fast: [None for _ in d.stream(z[0])], args.reps)
    rows.append({"variant": "worker_fast_decoder", "warmup_s": warm, **r,
                 **compare(out, ref32, eager)})
    print(json.dumps({k: rows[-1][k] for k in ("variant", "wall_s", "warmup_s")}), flush=True)
    del fast, out
    for v in VARIANTS:
        if v.name not in args.variants.split(",") and args.variants != "all":
            continue
        try:
            clip = Clip(vae, v, key)
            out = frames_of(clip.chunks(z))
            r = timed(lambda ev, c=clip: [None for _ in c.chunks(z, ev)], args.reps)
        except Exception as e:  # noqa: BLE001 - one broken variant must not end the run
            errors.append({"variant": v.name, "error": repr(e)[:2000]})
            print(json.dumps(errors[-1]), flush=True)
            continue
        rows.append({"variant": v.name, "warmup_s": clip.warmup_s, **r,
                     **compare(out, ref32, eager)})
        print(json.dumps({k: rows[-1][k] for k in ("variant", "wall_s", "chunk_ms")}),
              flush=True)
        del clip, out
    frames = args.frames
    for row in rows:
        row["frames_per_s"] = frames / row["wall_s"]
        row["x_vs_diffusers"] = rows[0]["wall_s"] / row["wall_s"]  # rows[0]: diffusers
    return {"size": size, "frames": frames, "rows": rows, "errors": errors}


def bench_batch(args: argparse.Namespace, size: str, vae: Any, best: Variant) -> list[Any]:
    """Steady-state chunks for B clips at once: does batching raise frames/s?"""
    w, h = (int(v) for v in size.split("x"))
    out = []
    for b in [int(x) for x in args.batches.split(",")]:
        key = (b, 16, h // 8, w // 8, vae.dtype)
        z = torch.randn(b, 16, 6, h // 8, w // 8).to(vae.dtype)
        try:
            clip = Clip(vae, best, key)
            r = timed(lambda ev, c=clip, z=z: [None for _ in c.chunks(z, ev)], args.reps)
        except Exception as e:  # noqa: BLE001 - e.g. out of memory at a large batch
            out.append({"size": size, "batch": b, "error": repr(e)[:2000]})
            print(json.dumps(out[-1]), flush=True)
            continue
        fps = b * 4 / (r["chunk_ms"] / 1e3)
        out.append({"size": size, "batch": b, "variant": best.name, "warmup_s": clip.warmup_s,
                    "chunk_ms": r["chunk_ms"], "steady_frames_per_s": fps,
                    "peak_gpu_mib": r["peak_gpu_mib"]})
        print(json.dumps(out[-1]), flush=True)
        del clip
    return out


def profile(vae: Any, size: str, variants: list[Variant]) -> dict[str, Any]:
    """Top kernels by GPU time over three steady-state chunks."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    w, h = (int(v) for v in size.split("x"))
    key = (1, 16, h // 8, w // 8, vae.dtype)
    z = torch.randn(1, 16, 4, h // 8, w // 8).to(vae.dtype)
    result = {}
    for v in variants:
        clip = Clip(vae, v, key)
        list(clip.chunks(z))
        it = clip.chunks(z)
        next(it)
        torch.cuda.synchronize()
        with prof(activities=[ProfilerActivity.CUDA]) as p:
            for _ in it:
                pass
            torch.cuda.synchronize()
        rows = sorted(p.key_averages(), key=lambda e: -e.device_time_total)
        total = sum(e.device_time_total for e in rows)
        result[v.name] = {"total_ms_3_chunks": total / 1e3, "top": [
            {"name": e.key[:120], "ms": e.device_time_total / 1e3, "calls": e.count}
            for e in rows[:15]]}
        del clip
    return result


def table(results: dict[str, Any]) -> str:
    lines = ["| size | variant | ms/chunk | wall s | frames/s | × diffusers | warm-up s | "
             "peak GPU MiB | rel L2 vs fp32 | max Δ uint8 vs eager |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in results["sizes"]:
        for r in s["rows"]:
            ms = f"{r['chunk_ms']:.1f}" if r.get("chunk_ms") else "-"
            warm = f"{r['warmup_s']:.1f}" if r.get("warmup_s") else "-"
            lines.append(
                f"| {s['size']} | {r['variant']} | {ms} | {r['wall_s']:.3f} | "
                f"{r['frames_per_s']:.1f} | {r['x_vs_diffusers']:.2f} | {warm} | "
                f"{r['peak_gpu_mib']:.0f} | {r['rel_l2_vs_fp32']:.2e} | "
                f"{r['max_abs_uint8_vs_eager_bf16']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1280x720,832x480")
    ap.add_argument("--frames", type=int, default=81)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--variants", default="all")
    ap.add_argument("--best", default="+graph", help="variant for the batch and profile runs")
    ap.add_argument("--batches", default="1,2,4")
    ap.add_argument("--batch-sizes", default="1280x720")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", default="bench/results/decode.json")
    args = ap.parse_args()
    torch._dynamo.config.recompile_limit = 64  # one compile per variant, size and batch here
    dtype = getattr(torch, args.dtype)
    vae = build_vae("wan2.1", seed=0, dtype=dtype).to("cuda")
    vae32 = build_vae("wan2.1", seed=0).to("cuda")
    results: dict[str, Any] = {
        "command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        **device_report("cuda"),
        "dtype": args.dtype, "sizes": [], "batch": [], "profile": {}}

    def save() -> None:
        write_json(args.out, results)

    for size in args.sizes.split(","):
        results["sizes"].append(bench_size(args, size, vae, vae32))
        save()
    best = next(v for v in VARIANTS if v.name == args.best)
    for size in args.batch_sizes.split(","):
        if size:
            results["batch"] += bench_batch(args, size, vae, best)
            save()
    if args.profile:
        results["profile"] = profile(vae, args.sizes.split(",")[0], [VARIANTS[2], best])
        save()
    print(table(results))
    for b in results["batch"]:
        if "error" in b:
            continue
        print(f"batch {b['batch']} {b['size']}: {b['chunk_ms']:.1f} ms/chunk, "
              f"{b['steady_frames_per_s']:.1f} frames/s, warm-up {b['warmup_s']:.1f} s")


if __name__ == "__main__":
    main()
