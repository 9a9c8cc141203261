"""First look at issue 8 (a faster Wan decode): cheap switches on the eager streamed decode.

Per variant: median ms per steady-state chunk (CUDA events), whole-clip wall, and relative
L2 of the output against the baseline variant. Variants: baseline (eager, cudnn.benchmark
off), cudnn.benchmark, channels_last_3d (weights + input), both; and diffusers' own
``vae.decode`` for reference.

  python bench/decode_probe.py --size 1280x720 --frames 81 --reps 3 --out decode-probe.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worker.decoders.wan import WanDecoder, build_vae


def run(decoder: WanDecoder, z: torch.Tensor, _channels_last: bool) -> tuple[float, list[float],
                                                                             torch.Tensor]:
    chunk_ms, last = [], None
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    it = decoder.stream(z)  # weights carry the memory format; activations follow them
    while True:
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        chunk = next(it, None)
        if chunk is None:
            break
        e.record()
        chunk_ms.append((s, e))
        last = chunk.float().clone()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    assert last is not None
    return wall, [s.elapsed_time(e) for s, e in chunk_ms], last


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="1280x720")
    ap.add_argument("--frames", type=int, default=81)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default="bench/results/decode-probe.json")
    args = ap.parse_args()
    w, h = (int(v) for v in args.size.split("x"))
    z = torch.randn(16, (args.frames - 1) // 4 + 1, h // 8, w // 8,
                    generator=torch.Generator().manual_seed(0))
    device = torch.device("cuda")
    vae = build_vae("wan2.1", seed=0, dtype=torch.bfloat16)
    results: dict[str, Any] = {"command": "python " + " ".join(sys.argv),
                               "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                               "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                               "size": args.size, "frames": args.frames, "variants": []}
    reference = None
    for name, bench_flag, cl in [("baseline", False, False), ("cudnn_benchmark", True, False),
                                 ("channels_last_3d", False, True), ("both", True, True)]:
        torch.backends.cudnn.benchmark = bench_flag
        fmt = torch.channels_last_3d if cl else torch.contiguous_format
        for param in vae.parameters():  # Module.to(memory_format) refuses the 1-D biases
            if param.dim() == 5:
                param.data = param.data.to(memory_format=fmt)
        decoder = WanDecoder(vae, device)
        t0 = time.perf_counter()
        run(decoder, z[:, :3], cl)  # warm-up (and cudnn autotuning)
        warm = time.perf_counter() - t0
        walls, chunks = [], []
        for _ in range(args.reps):
            wall, ms, last = run(decoder, z, cl)
            walls.append(wall)
            chunks += ms[1:]
        if reference is None:
            reference = last
        rel = float((last - reference).norm() / reference.norm())
        row = {"variant": name, "wall_s": statistics.median(walls),
               "chunk_ms_median": statistics.median(chunks), "warmup_s": warm,
               "rel_l2_vs_baseline": rel}
        results["variants"].append(row)
        print(json.dumps(row), flush=True)
    torch.backends.cudnn.benchmark = False
    for param in vae.parameters():
        if param.dim() == 5:
            param.data = param.data.contiguous()
    walls = []
    for _ in range(args.reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.inference_mode():
            vae.decode(z.to(device, torch.bfloat16)[None])
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
    results["diffusers_vae_decode_wall_s"] = statistics.median(walls)
    print("diffusers vae.decode", statistics.median(walls), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
