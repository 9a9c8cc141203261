"""Decode benchmark for issue 12: Wan2.2's own VAE (TI2V-5B) and Wan2.1 on the fast path.

Per model (seeded random weights, bf16, random latents), in one process so that compiling is
paid once per size and the correctness checks and timings share it:
  diffusers      ``vae.decode(z)`` of the whole clip (eager: the reference speed and frames)
  fast:VARIANT   ``WanDecoder(graphs=1)`` as a worker runs it (eager first chunk, then the
                 compiled, captured steady chunk), compile options of VARIANT (see VARIANTS)
Per row: wall (median of --reps), × diffusers, warm-up (compile + capture) seconds, peak GPU
memory, frames against diffusers' bf16 frames (relative L2, max |Δ| of uint8 frames) and, on
the first --ref-latents latent frames, against an fp32 eager reference (TF32 off) next to
diffusers' own bf16 error. Optionally: the same decoder on 4× the frames (peak memory must
stay flat; diffusers' with --diffusers-4x). Writes JSON; prints a markdown table. A whole job
against its decode is bench/decode/pipeline.py's measure alone (this script's ``--job`` is retired:
run after the diffusers decode and the other variants in one process, it disagreed with
pipeline.py by 2.4 %).

  python bench/decode/decode_fast.py --wan22 1280x704x121 --wan21 1280x720x81 --reps 3 \
      --variants22 base --variants21 base,fused,fused+cdt --mem4x --out decode.json
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.report import device_report, write_json
from worker.decoders.wan import WanDecoder, build_vae
from worker.decoders.wan_graph import ChunkGraphs

#: name → ChunkGraphs keyword arguments (compile options and the history form)
VARIANTS: dict[str, dict[str, Any]] = {
    "base": {"options": {}, "fused_history": False},
    "fused": {"options": {}, "fused_history": True},
    "cdt": {"options": {"coordinate_descent_tuning": True}, "fused_history": False},
    "fused+cdt": {"options": {"coordinate_descent_tuning": True}, "fused_history": True},
    "sub": {"options": {}, "fused_history": False, "subpixel": True},
    "sub+fused": {"options": {}, "fused_history": True, "subpixel": True},
}


def sync() -> None:
    torch.cuda.synchronize()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def uint8(x: torch.Tensor) -> torch.Tensor:
    return ((x.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.int16)


def max_du8(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((uint8(a) - uint8(b)).abs().max())


def walls(fn: Any, reps: int) -> dict[str, Any]:
    out = []
    torch.cuda.reset_peak_memory_stats()
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t0)
    return {"wall_s": statistics.median(out), "walls_s": out,
            "peak_gpu_mib": torch.cuda.max_memory_allocated() / 2**20}


def stream_into(decoder: WanDecoder, z: torch.Tensor, frames: torch.Tensor | None) -> None:
    """Consume a stream; copy the chunks into ``frames`` (3, F, H, W) when given."""
    first = 0
    for chunk in decoder.stream(z):
        if frames is not None:
            frames[:, first : first + chunk.shape[1]].copy_(chunk)
        first += chunk.shape[1]


def bench_model(args: argparse.Namespace, preset: str, size: str, variants: list[str],
                results: dict[str, Any], save: Any) -> dict[str, Any]:
    """One model's rows; ``results["models"]`` holds them from the start and ``save`` runs
    after each row, so a run stopped at its time limit keeps what it measured."""
    w, h, frames = (int(v) for v in size.split("x"))
    t0 = time.perf_counter()
    vae = build_vae(preset, seed=0, dtype=torch.bfloat16, device="cuda")
    build_s = time.perf_counter() - t0
    c = int(vae.config.z_dim)
    scale = 8 * (vae.config.get("patch_size") or 1)
    lh, lw, lt = h // scale, w // scale, (frames - 1) // 4 + 1
    z = torch.randn(c, lt, lh, lw, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    res: dict[str, Any] = {"preset": preset, "size": size, "latents": [c, lt, lh, lw],
                           "vae_build_s": build_s, "rows": [], "errors": []}
    results["models"].append(res)
    print(f"== {preset} {size}: latents {tuple(z.shape)}", flush=True)

    # fp32 reference on the first latent frames: the same (bf16-rounded) weights in fp32
    # arithmetic, eager, TF32 off.
    n = min(args.ref_latents, lt)
    nf = 1 + 4 * (n - 1)
    vae32 = copy.deepcopy(vae).float()
    torch.backends.cudnn.allow_tf32 = False
    ref32 = torch.empty((3, nf, h, w), device="cuda")
    stream_into(WanDecoder(vae32, "cuda"), z[:, :n].float(), ref32)
    torch.backends.cudnn.allow_tf32 = True
    del vae32
    torch.cuda.empty_cache()

    zc = z.to("cuda")[None]
    torch.backends.cudnn.benchmark = False  # diffusers as a user runs it
    with torch.inference_mode():
        diff = vae.decode(zc).sample[0]
        r = walls(lambda: vae.decode(zc), args.reps)
    diff_err = rel(diff[:, :nf], ref32)
    res["rows"].append({"variant": "diffusers", **r, "rel_l2_vs_fp32_first": diff_err,
                        "rel_l2_vs_diffusers": 0.0, "max_du8_vs_diffusers": 0,
                        "x_vs_diffusers": 1.0, "frames_per_s": frames / r["wall_s"]})
    print(json.dumps(res["rows"][-1]), flush=True)
    save()
    if args.diffusers_4x:
        z4 = torch.randn(c, 4 * (lt - 1) + 1, lh, lw).to("cuda", torch.bfloat16)[None]
        torch.cuda.reset_peak_memory_stats()
        with torch.inference_mode():
            t = time.perf_counter()
            vae.decode(z4)
            sync()
        res["diffusers_4x"] = {"frames": 4 * (frames - 1) + 1, "wall_s": time.perf_counter() - t,
                               "peak_gpu_mib": torch.cuda.max_memory_allocated() / 2**20}
        print(json.dumps(res["diffusers_4x"]), flush=True)
        del z4
    torch.cuda.empty_cache()

    out = torch.empty((3, frames, h, w), device="cuda", dtype=torch.bfloat16)
    for name in variants:
        try:
            dec = WanDecoder(vae, "cuda", graphs=0)
            dec.graphs = ChunkGraphs.for_vae(vae, torch.device("cuda"), capacity=1,
                                             **{"subpixel": False, **VARIANTS[name]})
            t = time.perf_counter()
            dec.warmup(lh, lw)
            sync()
            warm = time.perf_counter() - t
            # the first-chunk graph's build, queued by the warm-up: never beside a timed decode
            dec.graphs.wait(timeout=900)
            assert dec.graphs.get(dec.graph_key(lh, lw)) is not None, "capture failed"
            out.fill_(float("nan"))  # every frame must be written
            stream_into(dec, z, out)
            r = walls(lambda d=dec: stream_into(d, z, None), args.reps)
        except Exception as e:  # noqa: BLE001 - one broken variant must not end the run
            res["errors"].append({"variant": name, "error": repr(e)[:2000]})
            print(json.dumps(res["errors"][-1]), flush=True)
            continue
        row = {"variant": f"fast:{name}", "warmup_s": warm, **r,
               "finite": bool(torch.isfinite(out).all()),
               "rel_l2_vs_fp32_first": rel(out[:, :nf], ref32),
               "rel_l2_vs_diffusers": rel(out, diff), "max_du8_vs_diffusers": max_du8(out, diff),
               "x_vs_diffusers": res["rows"][0]["wall_s"] / r["wall_s"],
               "frames_per_s": frames / r["wall_s"]}
        res["rows"].append(row)
        print(json.dumps(row), flush=True)
        save()
        if name == (args.job_variant or variants[0]) and args.mem4x:
            z4 = torch.randn(c, 4 * (lt - 1) + 1, lh, lw).to(torch.bfloat16)
            torch.cuda.reset_peak_memory_stats()
            stream_into(dec, z4, None)  # warm allocator: what a worker's next job sees
            r4 = walls(lambda d=dec, z4=z4: stream_into(d, z4, None), 1)
            res["fast_4x"] = {"variant": name, "frames": 4 * (frames - 1) + 1, **r4,
                              "peak_1x_gpu_mib": row["peak_gpu_mib"],
                              "ratio_4x_to_1x": r4["peak_gpu_mib"] / row["peak_gpu_mib"]}
            print(json.dumps(res["fast_4x"]), flush=True)
        del dec
        torch.cuda.empty_cache()
    return res


def table(results: dict[str, Any]) -> str:
    lines = ["| model | size | variant | wall s | frames/s | × diffusers | warm-up s | "
             "peak GPU MiB | rel L2 vs fp32 (first) | rel L2 vs diffusers | max Δ uint8 |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in results["models"]:
        for r in m["rows"]:
            warm = f"{r['warmup_s']:.1f}" if r.get("warmup_s") else "-"
            lines.append(
                f"| {m['preset']} | {m['size']} | {r['variant']} | {r['wall_s']:.3f} | "
                f"{r['frames_per_s']:.1f} | {r['x_vs_diffusers']:.2f} | {warm} | "
                f"{r['peak_gpu_mib']:.0f} | {r['rel_l2_vs_fp32_first']:.2e} | "
                f"{r['rel_l2_vs_diffusers']:.2e} | {r['max_du8_vs_diffusers']} |")
    for m in results["models"]:
        if "fast_4x" in m:
            f4 = m["fast_4x"]
            lines.append(f"\n{m['preset']} 4× frames ({f4['frames']}): peak "
                         f"{f4['peak_gpu_mib']:.0f} MiB vs {f4['peak_1x_gpu_mib']:.0f} at 1× "
                         f"= {f4['ratio_4x_to_1x']:.3f}×, wall {f4['wall_s']:.2f} s")
        if "diffusers_4x" in m:
            d4 = m["diffusers_4x"]
            lines.append(f"{m['preset']} diffusers at 4×: peak {d4['peak_gpu_mib']:.0f} MiB, "
                         f"wall {d4['wall_s']:.2f} s")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wan22", default="1280x704x121", help="WxHxF; empty: skip")
    ap.add_argument("--wan21", default="1280x720x81", help="WxHxF; empty: skip")
    ap.add_argument("--variants22", default="base")
    ap.add_argument("--variants21", default="base")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ref-latents", type=int, default=3)
    ap.add_argument("--mem4x", action="store_true")
    ap.add_argument("--diffusers-4x", action="store_true")
    ap.add_argument("--job-variant", default=None,
                    help="the variant --mem4x measures (default: the first)")
    ap.add_argument("--out", default="bench/results/decode-fast.json")
    args = ap.parse_args()
    torch._dynamo.config.recompile_limit = 64
    results: dict[str, Any] = {
        "command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        **device_report("cuda"), "models": []}

    def save() -> None:
        write_json(args.out, results)

    if args.wan22:
        bench_model(args, "wan2.2", args.wan22, args.variants22.split(","), results, save)
        save()
    if args.wan21:
        bench_model(args, "wan2.1", args.wan21, args.variants21.split(","), results, save)
        save()
    print(table(results))


if __name__ == "__main__":
    main()
