"""Worker start benchmark for issue 12: process start → first graph replay, cold and warm.

Starts fresh Python processes that do what a worker's pool process does at start
(``default_decoders`` + ``worker.lifecycle.warmup.warm_up``: import, build the warm-up
decoder, compile and capture every warm-up size, one short decode replaying the graph) with one
``FRAMEFLEET_COMPILE_CACHE_DIR``: the first run finds it empty (cold), the next ones find what
the first left (warm: a restarted worker; a run is "cold" when the cache folder is empty at its
start). The clock starts before the process is spawned.

  python bench/warm_start.py --decoder wan2.2-vae --sizes 44x80 --runs 2 --cache DIR \
      --out warm_start.json

``--load-probe`` instead times the ways of building the decoder itself, each in a fresh process
(random init on the CPU or on the GPU; ``from_pretrained`` of a saved folder with diffusers'
loading options), and checks that every folder load gives the same weights.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def child() -> None:
    """One worker start; prints one JSON line."""
    t_imp = time.time()
    sys.path.insert(0, str(ROOT))
    import torch

    from producer.settings import get_settings
    from worker.lifecycle import warmup
    from worker.run import default_decoders

    t_imported = time.time()
    settings = get_settings()
    decoders = default_decoders(settings)
    profile_to = os.environ.get("BENCH_PROFILE")
    if profile_to:  # an extra, untimed run: cProfile slows tracing down
        import cProfile
        import pstats

        prof = cProfile.Profile()
        state = prof.runcall(warmup.warm_up, decoders, settings)
        with open(profile_to, "w") as f:
            pstats.Stats(prof, stream=f).sort_stats("cumulative").print_stats(60)
    else:
        state = warmup.warm_up(decoders, settings)
    torch.cuda.synchronize()
    t_ready = time.time()
    from torch._dynamo.utils import compile_times, counters

    spawn = float(os.environ["BENCH_SPAWN_T"])
    print(json.dumps({
        "start_to_first_replay_s": t_ready - spawn, "interpreter_s": t_imp - spawn,
        "imports_s": t_imported - t_imp, "warm_up_s": state.seconds,
        "decoder_build_s": state.build_s, "sizes": state.sizes,
        "compile_times_s": {k: round(float(v), 3) for k, v in
                            zip(*compile_times(repr="csv", aggregate=True), strict=True)
                            if float(v) >= 0.05},
        "inductor_counters": {k: v for k, v in counters["inductor"].items()
                              if "cache" in k},
        "aot_autograd_counters": {k: v for k, v in counters["aot_autograd"].items()
                                  if "cache" in k},
    }), flush=True)


def _save_weights(decoder: str, work: str) -> str:
    """A diffusers-layout folder of the decoder's architecture (seeded random weights, built on
    the GPU and saved in bf16): what a worker's FRAMEFLEET_WARMUP_WEIGHTS names."""
    sys.path.insert(0, str(ROOT))
    import torch
    from diffusers import AutoencoderKLWan

    from producer.spec import DecoderSpec
    from worker.decoders.wan import PRESETS

    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        vae = AutoencoderKLWan(**PRESETS[DecoderSpec(name=decoder).preset])
    folder = str(Path(work) / "vae")
    vae.to(torch.bfloat16).save_pretrained(folder)
    del vae
    return folder


#: name → how the probe builds the decoder (``build_vae`` with these, or from_pretrained options)
PROBES: dict[str, dict[str, Any]] = {
    "random-cpu": {"random": "cpu"},
    "random-cuda": {"random": "cuda"},
    "folder": {},
    "folder-device_map": {"device_map": "cuda"},
    "folder-disable_mmap": {"disable_mmap": True},
    "folder-disable_mmap-device_map": {"disable_mmap": True, "device_map": "cuda"},
}


def probe_child(name: str, preset: str, folder: str) -> None:
    """One way of building the decoder on the GPU, timed; prints one JSON line."""
    sys.path.insert(0, str(ROOT))
    import torch
    from diffusers import AutoencoderKLWan

    from worker.decoders.wan import build_vae

    torch.zeros(1, device="cuda")  # CUDA context outside the clock
    how = PROBES[name]
    t = time.perf_counter()
    if "random" in how:
        vae = build_vae(preset, seed=0, dtype=torch.bfloat16, device=how["random"]).to("cuda")
    else:
        vae = AutoencoderKLWan.from_pretrained(folder, torch_dtype=torch.bfloat16, **how)
        vae = vae.to("cuda")
    torch.cuda.synchronize()
    build = time.perf_counter() - t
    checksum = sum(float(p.float().sum()) for p in vae.parameters())
    print(json.dumps({"probe": name, "build_s": build, "checksum": checksum,
                      "device": str(next(vae.parameters()).device)}), flush=True)


def load_probe(args: argparse.Namespace, work: str) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from producer.spec import DecoderSpec

    folder = _save_weights(args.decoder, work)
    preset = DecoderSpec(name=args.decoder).preset
    rows = []
    for name in PROBES:
        done = subprocess.run([sys.executable, __file__, "--probe-child", name, preset, folder],
                              text=True, capture_output=True, timeout=300, check=False)
        row = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 \
            else {"probe": name, "error": done.stderr[-2000:]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    sums = {r["checksum"] for r in rows if r["probe"].startswith("folder") and "checksum" in r}
    return {"probes": rows, "folder_loads_agree": len(sums) == 1}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--probe-child", nargs=3, metavar=("NAME", "PRESET", "FOLDER"))
    ap.add_argument("--load-probe", action="store_true")
    ap.add_argument("--profile", action="store_true",
                    help="one more run under cProfile (not timed), top entries to OUT.profile.txt")
    ap.add_argument("--decoder", default="wan2.2-vae")
    ap.add_argument("--sizes", default="44x80")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--cache", default=None, help="compile cache folder (default: a new one)")
    ap.add_argument("--out", default="bench/results/warm-start.json")
    ap.add_argument("--weights", action="store_true",
                    help="load the decoder from a weights folder (random weights saved once, "
                    "untimed) as a production worker does, instead of a random init")
    args = ap.parse_args()
    if args.child:
        child()
        return
    if args.probe_child:
        probe_child(*args.probe_child)
        return
    cache = args.cache or tempfile.mkdtemp(prefix="compile-cache-")
    work = tempfile.mkdtemp(prefix="work-")
    if args.load_probe:
        import torch

        probe = {"command": "python " + " ".join(sys.argv),
                 "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                 "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                 "decoder": args.decoder, **load_probe(args, work)}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(probe, indent=2))
        return
    runs: list[dict[str, Any]] = []
    extra: dict[str, str] = {}
    if args.weights:
        folder = _save_weights(args.decoder, work)
        extra = {"FRAMEFLEET_WARMUP_WEIGHTS": Path(folder).as_uri(),
                 "FRAMEFLEET_FILE_ROOTS": work}
    profile = Path(args.out).with_suffix(".profile.txt") if args.profile else None
    for i in range(args.runs + (1 if profile else 0)):
        cold = not any(p.is_file() for p in Path(cache).rglob("*"))
        env = {**os.environ, **extra, "FRAMEFLEET_WARMUP_DECODER": args.decoder,
               "FRAMEFLEET_WARMUP_LATENT_SIZE": args.sizes, "FRAMEFLEET_COMPILE_CACHE_DIR": cache,
               "FRAMEFLEET_WORK_DIR": work, "FRAMEFLEET_DEVICE": "cuda",
               "FRAMEFLEET_DECODE_GRAPHS": "2", "BENCH_SPAWN_T": repr(time.time())}
        if profile is not None and i == args.runs:
            env["BENCH_PROFILE"] = str(profile)
        done = subprocess.run([sys.executable, __file__, "--child"], env=env, text=True,
                              capture_output=True, timeout=600, check=False)
        if done.returncode != 0:
            runs.append({"run": i, "error": done.stderr[-3000:]})
            print(done.stderr[-3000:], flush=True)
            break
        row = json.loads(done.stdout.strip().splitlines()[-1])
        row["run"] = "profiled" if "BENCH_PROFILE" in env else ("cold" if cold else f"warm{i}")
        runs.append(row)
        print(json.dumps(row), flush=True)
    import torch

    out = {"command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
           "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "decoder": args.decoder, "sizes": args.sizes, "weights_folder": args.weights,
           "runs": runs}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    for r in runs:
        if "error" not in r:
            print(f"{r['run']}: process start → first graph replay "
                  f"{r['start_to_first_replay_s']:.1f} s (imports {r['imports_s']:.1f} s, "
                  f"decoder build {r['decoder_build_s']:.1f} s, warm-up {r['warm_up_s']:.1f} s: "
                  f"{r['sizes']})")


if __name__ == "__main__":
    main()
