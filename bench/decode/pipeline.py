"""Pipeline benchmark: a whole job against its pure decode, per decoder, in one process.

The project's one measure of a job's overhead over its decode (``decode_fast.py --job`` is
retired: it ran these same modes after other work in its process, with another decoder build).
Per job (``--jobs PRESET:WxHxF,...``) the decoder is built as a worker builds it: seeded random
weights initialised on the device (``build_vae(..., device=...)``), bf16, ``WanDecoder(graphs=2)``
with its first-chunk graph; it is warmed up and every graph build is waited for. Then each
repetition runs every mode once, in turn (interleaved: slow drift of clocks or temperature
hits every mode alike):
  decode_only   the decoder's stream, nothing else (the floor)
  async         the framefleet pipeline: streams, events, pinned ring, encoder threads, upload
                to a file:// store; ``async_tailN``: the last chunk's frames in N segments
  sequential    decode → synchronous fp32 .cpu() → CPU post-process → encode → upload
  diffusers     vae.decode(z) on the whole clip, then diffusers' export_to_video
Per mode: wall (median), ratio to decode_only (of the medians, and the median of per-repetition
ratios), the tail (last chunk's planes on the host → last segment stored), stage seconds, GPU
busy fraction inside the decode window, segment bytes, peak GPU memory and host RSS.
``--weights-study``: the first job's async mode again, alternating with a decoder whose weights
were initialised on the CPU (another random network: other frames for the encoder). Writes
JSON; prints a markdown table.

  python bench/decode/pipeline.py --device cuda --reps 5 \\
      --jobs wan2.1:1280x720x81,wan2.2:1280x720x81,wan2.2:1280x704x121 --out pipeline.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.decode.pipeline_modes import SEGMENT_FRAMES, run_once, summarise
from bench.report import device_report, write_json
from worker.decoders.wan import DTYPES, WanDecoder, build_vae


def parse_job(text: str) -> tuple[str, int, int, int]:
    preset, size = text.split(":")
    w, h, f = (int(v) for v in size.split("x"))
    return preset, w, h, f


def make_decoder(preset: str, device: torch.device, dtype: torch.dtype, graphs: int,
                 init_on: torch.device) -> WanDecoder:
    vae = build_vae(preset, seed=0, dtype=dtype, device=init_on)
    return WanDecoder(vae, device, graphs=graphs)


def warm(decoder: WanDecoder, lh: int, lw: int) -> dict[str, Any]:
    """Compile and capture (steady and first-chunk graphs) and wait for both."""
    t0 = time.perf_counter()
    decoder.warmup(lh, lw)
    steady_s = time.perf_counter() - t0
    out: dict[str, Any] = {"steady_s": steady_s}
    if decoder.graphs is not None:
        decoder.graphs.wait(timeout=900)
        graph = decoder.graphs.get(decoder.graph_key(lh, lw))
        out.update(total_s=time.perf_counter() - t0, graph=graph is not None,
                   phases=graph.phases if graph else None,
                   first_graph=graph is not None and graph.first is not None,
                   first_phases=graph.first.phases if graph and graph.first else None)
        out["vs_eager"] = check(decoder, lh, lw)
    return out


def check(decoder: WanDecoder, lh: int, lw: int) -> dict[str, float]:
    """Relative L2 of three chunks through the graphs against the eager step (bf16 both
    ways, other kernels: about 1e-2 expected; a broken graph is of order 1)."""
    assert decoder.step is not None
    z = torch.randn(decoder.latent_channels, 3, lh, lw,
                    generator=torch.Generator().manual_seed(7))
    fast = torch.cat([c.float() for c in decoder.stream(z)], dim=1)
    zd = z.to(decoder.device, decoder.dtype)[None]
    eager, caches = [], None
    with torch.inference_mode():
        for i in range(3):
            out, caches = decoder.step(zd[:, :, i : i + 1], caches)
            eager.append(out[0].float())
    ref = torch.cat(eager, dim=1)

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a - b).norm() / b.norm())

    return {"rel_l2": rel(fast, ref), "first_frame_rel_l2": rel(fast[:, :1], ref[:, :1])}


def content(decoder: WanDecoder, z: torch.Tensor) -> dict[str, float]:
    """What the encoder is given (untimed): the share of clamped values and the spread of the
    decoded frames; random networks differ in both, and so does the encoder's work."""
    clamped = total = 0
    s = s2 = 0.0
    for chunk in decoder.stream(z):
        x = chunk.float()
        clamped += int((x.abs() >= 1.0).sum())
        total += x.numel()
        s += float(x.sum())
        s2 += float((x * x).sum())
    mean = s / total
    return {"clamped_share": clamped / total, "mean": mean, "std": (s2 / total - mean**2) ** 0.5}


def bench_job(args: argparse.Namespace, job: str, device: torch.device, dtype: torch.dtype,
              work: Path, results: dict[str, Any], save: Callable[[], None]) -> None:
    preset, w, h, frames = parse_job(job)
    init_on = device if args.init == "device" else torch.device("cpu")
    t0 = time.perf_counter()
    decoder = make_decoder(preset, device, dtype, args.graphs, init_on)
    build_s = time.perf_counter() - t0
    scale = decoder.output_size(1, 1)[1]  # pixels per latent
    lh, lw, lt = h // scale, w // scale, (frames - 1) // 4 + 1
    if decoder.output_size(lh, lw) != (h, w) or 1 + 4 * (lt - 1) != frames:
        raise SystemExit(f"{job}: {preset} makes {w}x{h}x{frames} from no latent size "
                         f"(multiples of {scale} pixels, 4k+1 frames)")
    z = torch.randn(decoder.latent_channels, lt, lh, lw,
                    generator=torch.Generator().manual_seed(0))
    entry: dict[str, Any] = {"job": job, "decoder": decoder.name, "preset": preset,
                             "latents": [decoder.latent_channels, lt, lh, lw],
                             "build_s": build_s, "warmup": warm(decoder, lh, lw), "modes": []}
    results["jobs"].append(entry)
    print(f"== {job}: warm-up {entry['warmup']}", flush=True)
    if args.precompile:
        return
    if args.graphs and not entry["warmup"].get("graph"):
        print(f"{job}: no decode graph was captured (see the log): timing the eager decoder",
              flush=True)
    entry["content"] = content(decoder, z)
    modes = args.modes.split(",")
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for mode in modes:  # one untimed job per mode: first-call costs stay out of the numbers
        run_once(mode, decoder, z, work)
    for _ in range(args.reps):
        for mode in modes:
            runs[mode].append(run_once(mode, decoder, z, work))
    floor = runs.get("decode_only")
    for mode in modes:
        row = summarise(mode, runs[mode])
        if floor:
            row["x_decode_only"] = row["wall_s"] / statistics.median(r["wall_s"] for r in floor)
            row["x_decode_only_paired"] = statistics.median(
                a["wall_s"] / b["wall_s"] for a, b in zip(runs[mode], floor, strict=True))
        entry["modes"].append(row)
    save()
    if args.weights_study and job == results["jobs"][0]["job"]:
        other = make_decoder(preset, device, dtype, args.graphs, torch.device("cpu"))
        study: dict[str, Any] = {"init": "cpu", "warmup": warm(other, lh, lw),
                                 "content": content(other, z)}
        run_once("async", other, z, work)
        pairs = []
        for _ in range(args.study_reps):
            pairs.append((run_once("async", decoder, z, work), run_once("async", other, z, work)))
        study["async_device_init"] = summarise("async", [a for a, _ in pairs])
        study["async_cpu_init"] = summarise("async", [b for _, b in pairs])
        entry["weights_study"] = study
        del other
        save()
    del decoder
    if device.type == "cuda":
        torch.cuda.empty_cache()


def table(results: dict[str, Any]) -> str:
    lines = ["| job | mode | wall s | × decode-only | paired × | tail ms | GPU busy | "
             "segments | MB | peak GPU MiB |", "|---|---|---|---|---|---|---|---|---|---|"]
    for entry in results["jobs"]:
        for r in entry["modes"]:
            ratio = f"{r['x_decode_only']:.4f}" if "x_decode_only" in r else "-"
            paired = f"{r['x_decode_only_paired']:.4f}" if "x_decode_only_paired" in r else "-"
            tail = f"{r['tail_s'] * 1e3:.1f}" if "tail_s" in r else "-"
            busy = f"{r['gpu_busy_ratio'] * 100:.3f} %" if r.get("gpu_busy_ratio") else "-"
            mb = f"{r['bytes'] / 1e6:.1f}" if "bytes" in r else "-"
            gpu = f"{r['peak_gpu_bytes'] / 2**20:.0f}" if r.get("peak_gpu_bytes") else "-"
            lines.append(f"| {entry['job']} | {r['mode']} | {r['wall_s']:.3f} | {ratio} | "
                         f"{paired} | {tail} | {busy} | {r.get('segments', '-')} | {mb} | "
                         f"{gpu} |")
        study = entry.get("weights_study")
        if study:
            a, b = study["async_device_init"], study["async_cpu_init"]
            lines.append(f"| {entry['job']} | async, weights init on the device / on the CPU | "
                         f"{a['wall_s']:.3f} / {b['wall_s']:.3f} | | | {a['tail_s'] * 1e3:.1f}"
                         f" / {b['tail_s'] * 1e3:.1f} | | | {a['bytes'] / 1e6:.1f} / "
                         f"{b['bytes'] / 1e6:.1f} | |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    ap.add_argument("--jobs", default=None, help="PRESET:WxHxF,... (default: wan2.1 and wan2.2 "
                    "at 1280x720x81 and wan2.2 at 1280x704x121 on CUDA; tiny:256x256x41 on CPU)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--modes", default="decode_only,async")
    ap.add_argument("--graphs", type=int, default=2,
                    help="compiled decode graphs (the worker's default); 0: eager decode")
    ap.add_argument("--init", choices=["device", "cpu"], default="device",
                    help="where the random weights are initialised (a worker: the device)")
    ap.add_argument("--weights-study", action="store_true")
    ap.add_argument("--study-reps", type=int, default=3)
    ap.add_argument("--precompile", action="store_true",
                    help="only build and warm up every job's decoder (fills the compile cache)")
    ap.add_argument("--out", default="bench/results/pipeline.json")
    args = ap.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype = DTYPES[args.dtype or ("bfloat16" if cuda else "float32")]
    jobs = args.jobs or ("wan2.1:1280x720x81,wan2.2:1280x720x81,wan2.2:1280x704x121" if cuda
                         else "tiny:256x256x41")
    work = Path(tempfile.mkdtemp(prefix="ffbench-"))
    results: dict[str, Any] = {
        "command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        **device_report(device), "cpu_count": os.cpu_count(), "dtype": str(dtype),
        "store": "file:// (local disk)", "segment_frames": SEGMENT_FRAMES, "reps": args.reps,
        "graphs": args.graphs, "init": args.init, "jobs": []}

    def save() -> None:
        write_json(args.out, results)

    for job in jobs.split(","):
        bench_job(args, job, device, dtype, work, results, save)
        save()
    print(table(results))


if __name__ == "__main__":
    main()
