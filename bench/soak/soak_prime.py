"""Fill the compile cache for the soak and the denoise benchmark in parallel (CUDA host).

A cold compile of one transformer size costs minutes on one core (2.5-4 min a size for the 5B
on the H200), and the soak's worker compiles its sizes one after the other: 6 sizes and tiers
would take 15-25 minutes before the first job. The compile cache
(``FRAMEFLEET_COMPILE_CACHE_DIR``: inductor's FX-graph and autograd caches, Triton's kernels)
is keyed by the graph, not the weights, so separate processes that build the same random-weight
model and compile one (preset, tier, size) each fill it for every later process: the soak's
worker and ``bench/generate/generate.py`` then load each size in seconds.

Each task runs in its own process, through the worker's own path (``ModelCache.adopt`` with the
tier, then ``worker.generate.model.warm.compile_size``), so the graphs are the ones a job
traces. The text encoder's weights are given up after the build (the warm-up step takes zero prompt
embeddings), and the builds start a few seconds apart, so the parallel processes fit in GPU memory.

``--artifacts DIR``: each task also builds its model's decoder graphs at its sizes (CUDA) and
writes what it compiled as a compile artifact (``worker.generate.model.artifacts``) into a
folder of its own under DIR (two tasks of one model and tier would write the same artifact's
name), which the soak's worker loads, with an empty compile cache, before it compiles
(``SOAK_WARM=all``: ``bench/soak/soak.py --artifacts DIR``). On the CPU (``--tiny``) only the
first soak task compiles, with inductor's C++ backend (a minute a size on two cores).

  python bench/soak/soak_prime.py --out dir \
      --task wan2.2-ti2v-5b:exact:480x832x49 --task wan2.2-ti2v-5b:fp8:480x832x49 ...
  python bench/soak/soak_prime.py --out dir --soak --bench     # the soak's and the bench's sizes
  python bench/soak/soak_prime.py --out dir --soak --bench --tiny   # the same on the CPU (CI)
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

#: The soak's sizes (bench/soak/soak_inputs.py) per preset and tier, (H, W, frames).
SOAK = ["wan2.2-ti2v-5b:exact:480x832x49", "wan2.2-ti2v-5b:exact:704x1280x33",
        "wan2.2-ti2v-5b:fp8:480x832x49", "wan2.2-ti2v-5b:fp8:704x1280x33",
        "wan2.1-t2v-1.3b:exact:480x832x33,320x576x33"]
#: bench/generate/generate.py's default sizes: the 5B at 1280x704x121, the 1.3B at 832x480x81.
BENCH = ["wan2.2-ti2v-5b:exact:704x1280x121", "wan2.2-ti2v-5b:fp8:704x1280x121",
         "wan2.1-t2v-1.3b:exact:480x832x81"]
#: ``--tiny``: the same tasks on the tiny presets at the tiny soak's and bench's sizes.
TINY_SOAK = ["tiny-ti2v:exact:64x64x9", "tiny-ti2v:exact:32x64x9", "tiny-ti2v:fp8:64x64x9",
             "tiny-ti2v:fp8:32x64x9", "tiny:exact:32x48x9,48x32x9"]
TINY_BENCH = ["tiny-ti2v:exact:64x64x9", "tiny-ti2v:fp8:64x64x9", "tiny:exact:32x48x9"]
#: ``--tiny --artifacts``: the one task the CPU compiles (the tiny soak's one compiled size).
TINY_COMPILED = ["tiny-ti2v:exact:64x64x9"]


def run_task(task: str, device_name: str, artifacts: str | None = None) -> dict[str, object]:
    """Build ``preset`` with random weights, make it the resident at ``tier``, compile each size;
    with ``artifacts`` (a folder), build its decoder's graphs and write the artifact there.

    On the CPU (the tiny presets, for the tests) the same steps run eager, nothing compiles,
    unless an artifact is asked for (inductor's C++ backend then)."""
    import torch

    from producer.errors import InvalidJobError
    from worker.generate.model.cache import ModelCache
    from worker.generate.model.presets import build_pipeline, save_configs
    from worker.generate.model.warm import compile_size, parse_video_sizes
    from worker.generate.request.folder import read_model
    from worker.generate.tier.tiers import check_tier
    from worker.lifecycle.warmup import use_compile_cache

    use_compile_cache(os.environ.get("FRAMEFLEET_COMPILE_CACHE_DIR"))
    preset, tier, sizes = task.split(":")
    device = torch.device(device_name)
    cuda = device.type == "cuda"
    t0 = time.perf_counter()
    pipe = build_pipeline(preset, device, torch.bfloat16 if cuda else torch.float32, seed=0)
    folder = Path(tempfile.mkdtemp(prefix="ff-prime-")) / preset
    save_configs(pipe, folder)
    # unused by the warm-up step: its 11 GB leave the GPU, and untouched host pages cost nothing
    pipe.text_encoder.to_empty(device="cpu")
    if cuda:
        torch.cuda.empty_cache()
    models = ModelCache(device, 2**40, offload_text_encoder=True, compiled_sizes=8,
                        graphs=8, compile_cpu=artifacts is not None)
    try:  # the worker's own refusal of a tier this device lacks (fp8 on the CPU): a skip
        check_tier(tier, device)
    except InvalidJobError as e:
        return {"task": task, "skipped": str(e)}
    entry = models.adopt(folder, pipe, tier)
    info = read_model(folder)
    times: dict[str, object] = {"build_s": round(time.perf_counter() - t0, 1)}
    if artifacts is not None:
        from worker.generate.model import artifacts as compiled

        compiled.start_recording()
    for h, w, f in parse_video_sizes(sizes):
        t = time.perf_counter()
        if not compile_size(models, entry, info, h, w, f) and (cuda or artifacts):
            raise RuntimeError(f"{task}: the transformer did not run compiled")
        times[f"{h}x{w}x{f}_s"] = round(time.perf_counter() - t, 1)
    if artifacts is not None:
        times["artifact"] = _write_artifact(models, entry, folder, tier, sizes, artifacts)
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
    return {"task": task, **times, "peak_gib": round(peak, 1)}


def _write_artifact(models: Any, entry: Any, folder: Path, tier: str, sizes: str,
                    where: str) -> dict[str, object]:
    """The decoder's graphs at ``sizes`` (CUDA), then what was compiled since the recording
    began, as the artifact of this model and tier in ``where``."""
    from worker.generate.model import artifacts, graphs
    from worker.generate.model.warm import parse_video_sizes

    built: dict[str, Any] = {}
    if models.device.type == "cuda":
        latents = graphs.latent_sizes(entry.pipe.vae, parse_video_sizes(sizes))
        built, _ = graphs.build(models.decoder(entry), latents)
    stamp = artifacts.stamp_for(folder, tier, models.device)
    written = artifacts.save(artifacts.Place(where), stamp, sizes.split(","), 2**31,
                             [k for k, v in built.items() if v["captured"]])
    if written is None:
        raise RuntimeError(f"{folder.name} {tier}: nothing compiled, no artifact written")
    return {"file": written.file, "bytes": written.bytes, "graphs": written.graphs}


def _refused(task: str, device: str) -> str | None:
    """The worker's refusal of ``task``'s tier on ``device`` (fp8 on the CPU), or None."""
    import torch

    from producer.errors import InvalidJobError
    from worker.generate.tier.tiers import check_tier

    try:
        check_tier(task.split(":")[1], torch.device(device))
    except InvalidJobError as e:
        return str(e)
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--task", action="append", default=[], help="preset:tier:HxWxF[,HxWxF]")
    ap.add_argument("--soak", action="store_true", help="the soak's sizes")
    ap.add_argument("--bench", action="store_true", help="generate/generate.py's default sizes")
    ap.add_argument("--stagger-s", type=float, default=12.0, help="between process starts")
    ap.add_argument("--compile-threads", default="3", help="TORCHINDUCTOR_COMPILE_THREADS each")
    ap.add_argument("--device", default=None,
                    help="default cuda (--tiny: cpu, the tiny presets' plumbing, eager)")
    ap.add_argument("--tiny", action="store_true",
                    help="--soak and --bench on the tiny presets, on the CPU, no stagger (CI)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--artifacts", default=None, metavar="DIR",
                    help="also write each task's compile artifact (decoder graphs included) "
                    "into a folder of its own under DIR, for the soak's worker to load")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a child: one task, JSON on stdout
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_task(args.one, args.device, args.artifacts)), flush=True)
        return 0
    args.device = args.device or ("cpu" if args.tiny else "cuda")
    soak, bench = (TINY_SOAK, TINY_BENCH) if args.tiny else (SOAK, BENCH)
    if args.tiny:
        args.stagger_s = 0.0
        if args.artifacts:  # a CPU compile costs a minute: the tiny soak compiles one size
            soak, bench = TINY_COMPILED, []
    tasks = args.task + (soak if args.soak else []) + (bench if args.bench else [])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": args.compile_threads}
    t0 = time.monotonic()
    results, failed, skipped = [], 0, 0
    procs = []
    for i, task in enumerate(tasks):
        refusal = _refused(task, args.device)
        if refusal:  # no process for a tier this device lacks: the worker's reason, recorded
            results.append({"task": task, "skipped": refusal})
            skipped += 1
            print(json.dumps(results[-1]), flush=True)
            continue
        if procs:
            time.sleep(args.stagger_s)
        log = (out / f"prime-{i}.log").open("w")
        mine = ["--artifacts", str(Path(args.artifacts).absolute() / f"task-{i}")] \
            if args.artifacts else []
        procs.append((task, log, subprocess.Popen(
            [sys.executable, __file__, "--out", args.out, "--device", args.device, *mine,
             "--one", task], env=env, stdout=subprocess.PIPE, stderr=log, text=True)))
    for task, log, proc in procs:
        stdout, _ = proc.communicate()
        log.close()
        lines = stdout.strip().splitlines()
        if proc.returncode == 0 and lines:
            results.append(json.loads(lines[-1]))
            skipped += "skipped" in results[-1]
        else:
            failed += 1
            results.append({"task": task, "error": f"exit {proc.returncode}"})
        print(json.dumps(results[-1]), flush=True)
    doc = {"wall_s": round(time.monotonic() - t0, 1), "tasks": results}
    from bench.report import write_json  # the repository root is on PYTHONPATH, as for worker

    write_json(out / "soak-prime.json", doc)
    print(f"primed {len(tasks) - failed - skipped}/{len(tasks)} tasks in {doc['wall_s']} s"
          + (f" ({skipped} skipped: a tier this device lacks)" if skipped else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
