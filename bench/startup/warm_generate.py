"""Worker start with the generation model: process start → ready, per tier, with a breakdown.

A fresh Python process does what a worker's pool process does for ``FRAMEFLEET_WARMUP_MODEL``
(``worker.generate.model.warm``): import, make the model resident at each tier (exact; fp8:
quantised), and compile the transformer for one size by running one denoise step, with
torch.compile's caches in ``FRAMEFLEET_COMPILE_CACHE_DIR``. Run after ``generate/generate.py`` at
the same size and cache folder, the compile is warm (a restarted worker); on an empty folder it
is cold. The weights are random and built on the GPU: that stands in for reading a folder from
disk, which this does not measure. The clock starts before the process is spawned.

  FRAMEFLEET_COMPILE_CACHE_DIR=DIR python bench/startup/warm_generate.py --model wan2.2-ti2v-5b \
      --size 704x1280x121 --tiers exact,fp8 --out warm.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def child(model: str, size: str, tiers: list[str]) -> None:
    """One worker start; prints one JSON line."""
    t0 = time.time()
    sys.path.insert(0, str(ROOT))
    import copy
    import tempfile

    import torch

    from producer.errors import InvalidJobError
    from worker.generate.model.cache import ModelCache
    from worker.generate.model.presets import build_pipeline, save_configs
    from worker.generate.model.warm import compile_size
    from worker.generate.request.folder import read_model
    from worker.generate.tier.tiers import check_tier
    from worker.lifecycle.warmup import use_compile_cache

    use_compile_cache(os.environ.get("FRAMEFLEET_COMPILE_CACHE_DIR"))
    cuda = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # CPU: a dry run
    sync = torch.cuda.synchronize if cuda.type == "cuda" else (lambda: None)
    times: dict[str, float | str] = {"imports_s": time.time() - t0}
    t = time.time()
    pipe = build_pipeline(model, cuda, torch.bfloat16 if cuda.type == "cuda" else torch.float32)
    spare = copy.deepcopy(pipe.transformer) if "fp8" in tiers else None
    sync()
    times["build_random_weights_s"] = time.time() - t
    folder = save_configs(pipe, Path(tempfile.mkdtemp()) / model)
    info = read_model(folder)
    models = ModelCache(cuda, 2**40, compiled_sizes=4)  # compiles on CUDA only
    h, w, f = (int(v) for v in size.split("x"))
    for tier in tiers:
        try:
            check_tier(tier, cuda)
        except InvalidJobError as e:
            times[f"{tier}_skipped"] = str(e)
            continue
        t = time.time()
        if tier == "fp8":
            from diffusers import WanPipeline

            pipe = WanPipeline(tokenizer=pipe.tokenizer, text_encoder=pipe.text_encoder,
                               vae=pipe.vae, scheduler=pipe.scheduler, transformer=spare,
                               expand_timesteps=pipe.config.expand_timesteps)
        entry = models.adopt(folder, pipe, tier)
        sync()
        times[f"{tier}_prepare_s"] = time.time() - t
        t = time.time()
        compile_size(models, entry, info, h, w, f)
        times[f"{tier}_first_step_s"] = time.time() - t
    print(json.dumps({"ready_s": time.time() - t0, **times}), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--model", default="wan2.2-ti2v-5b")
    ap.add_argument("--size", default="704x1280x121", help="HxWxF compiled")
    ap.add_argument("--tiers", default="exact,fp8")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.child:
        child(args.model, args.size, args.tiers.split(","))
        return 0
    cache = os.environ.get("FRAMEFLEET_COMPILE_CACHE_DIR")
    warm = bool(cache) and any(Path(cache).rglob("*"))
    t0 = time.time()
    done = subprocess.run([sys.executable, __file__, "--child", "--model", args.model,
                           "--size", args.size, "--tiers", args.tiers],
                          capture_output=True, text=True, check=False)
    wall = time.time() - t0
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode or not lines:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        return 1
    doc = {"command": " ".join(["python", *sys.argv]), "cache": "warm" if warm else "cold",
           "model": args.model, "size": args.size, "tiers": args.tiers,
           "process_start_to_ready_s": wall, "breakdown": json.loads(lines[-1]),
           "weights": "random, built on the GPU (reading a folder from disk is not measured)"}
    print(json.dumps(doc, indent=2))
    if args.out:
        sys.path.insert(0, str(ROOT))
        from bench.report import write_json

        write_json(args.out, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
