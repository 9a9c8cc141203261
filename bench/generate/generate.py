"""Generate-job benchmark: framefleet's whole job per speed tier vs diffusers' pipeline + export.

Per model (random weights at the real architecture, built directly on the device: UMT5-XXL
text encoder, the Wan transformer and VAE, Wan's UniPC scheduler) and per step count:

  diffusers    WanPipeline(same components, same scheduler config)(..., output_type="np"),
               eager, then diffusers.utils.export_to_video (PyAV libx264 when its backends are
               missing; the JSON says which ran). Run once per step count: every tier's
               speed-up is against it.
  framefleet   run_job of a generate spec per tier: ``exact`` (compiled blocks on CUDA),
               ``fp8`` (torchao float8, compiled; CUDA 8.9+ only) and ``cache`` (exact with the
               recommended step cache, RECOMMENDED_CACHE), ``fp8+cache`` (fp8 with that cache):
               prompt encode, denoise, latents
               handed on the GPU to the streamed decoder, async pipeline, file:// upload.

Correctness first: one transformer forward of each tier against eager (rel L2; the exact tier
must stay within 2e-2, else the run exits non-zero) and, on the CPU where the exact tier is
eager, framefleet's latents must equal diffusers' bit for bit. Quality per row: rel L2 of the
final latents and PSNR of the decoded MP4 frames against the exact tier at the same seed (with
random weights these measure the arithmetic's error, not a model's visual quality).

``--image`` adds an image-to-video job per model that can take one (TI2V) against diffusers'
WanImageToVideoPipeline; ``--lora`` the cost of a LoRA switch (gen_extra.py);
``--previews N`` runs each framefleet row again with a preview every N steps: the overhead in %
of the denoise, the time to the first preview, one preview frame as a PNG (gen_previews.py);
``--split`` one transformer forward of each tier that ran, by kernel class (gen_split.py).
``--budget-s`` stops the run in time: an item whose estimate does not fit is skipped and
listed with the reason, and what ran is saved after every row. For example:
  python bench/generate/generate.py --models wan2.2-ti2v-5b --steps 20,4 \
      --tiers exact,fp8,cache,fp8+cache --json denoise-h200.json --out DIR
  python bench/generate/generate.py --tiny --out DIR       # CPU, the same code paths (CI runs it)
  python bench/generate/generate.py --models wan2.2-ti2v-5b --steps 20 --tiers exact,cache \
      --previews 2 --json previews-h200.json --out DIR
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.generate import gen_extra, gen_previews, gen_split
from bench.generate.gen_report import markdown, table
from bench.generate.gen_runs import (
    baseline,
    forward_error,
    framefleet,
    frames_psnr,
    on_device,
    rel_l2,
    sync,
)
from bench.generate.gen_specs import RECOMMENDED_CACHE, gen_spec, job
from bench.report import device_report, write_json
from producer.errors import InvalidJobError, NonFiniteOutput
from producer.settings import Settings
from worker.generate.model.cache import ModelCache
from worker.generate.model.presets import PRESETS, build_pipeline, save_configs
from worker.generate.request.folder import read_model
from worker.generate.tier.tiers import check_tier
from worker.lifecycle.warmup import use_compile_cache
from worker.run import DecoderCache

#: Rough seconds on an H200 (5B at 1280x704x121, CFG on), to plan within the budget.
EST = {"build": 40, "fp8_prepare": 180, "base_fixed": 14, "base_step": 2.3,
       "ff_fixed": 8, "ff_step": 2.0}

#: --tiny's rows take about this share of the H200 estimates on a CI machine's CPU.
TINY_EST_SCALE = 0.05


class Budget:
    """Seconds left before ``deadline``; ``fits`` records what it refuses."""

    def __init__(self, seconds: float | None, doc: dict[str, Any], scale: float = 1.0) -> None:
        self.deadline = None if seconds is None else time.monotonic() + seconds
        self.doc = doc
        self.scale = scale  # of the H200 estimates (EST): --tiny's models are far smaller

    def fits(self, what: str, estimate: float) -> bool:
        estimate *= self.scale
        if self.deadline is None or time.monotonic() + estimate < self.deadline:
            return True
        self.doc["skipped"].append({"what": what, "reason": f"budget: needs ~{estimate:.0f} s, "
                                    f"{self.deadline - time.monotonic():.0f} s left"})
        print(f"SKIP {what}: over budget", flush=True)
        return False


class Model:
    """One architecture's residents (a tier each), its decoders and the settings jobs see."""

    def __init__(self, args: argparse.Namespace, name: str, device: torch.device,
                 dtype: torch.dtype, work: Path, tiers: list[str]) -> None:
        h, w, f = PRESETS[name].default_size
        if args.size:
            h, w, f = (int(v) for v in args.size.split("x"))
        self.name, self.size, self.device, self.work = name, (h, w, f), device, work
        t0 = time.perf_counter()
        self.pipe = build_pipeline(name, device, dtype, seed=0)
        # fp8 quantises a copy; taken before the exact resident's blocks are compiled
        spare = copy.deepcopy(self.pipe.transformer) if any(
            t.startswith("fp8") for t in tiers) else None
        sync(device)
        self.build_s = time.perf_counter() - t0
        self.folder = save_configs(self.pipe, work / name)
        self.info = read_model(self.folder)
        self.settings = Settings(device=device.type, max_denoise_steps=10_000,
                                 max_pixels=4096 * 4096, decode_graphs=args.decode_graphs,
                                 work_dir=str(work), file_roots=str(work),
                                 compiled_sizes=4 if device.type == "cuda" else 0,
                                 # the rows without previews (the worker's default makes them)
                                 preview_every=0)
        self.models = ModelCache(device, 2**40, graphs=args.decode_graphs,
                                 compiled_sizes=self.settings.compiled_sizes)
        self.exact = self.models.adopt(self.folder, self.pipe, "exact")
        self.decoders = DecoderCache(device, graphs=args.decode_graphs, models=self.models)
        self.spare, self.fp8 = spare, None
        self.meta = {"model": name, "size": f"{w}x{h}x{f}", "build_s": self.build_s,
                     "resident_gib": self.exact.bytes / 2**30}

    @on_device("fp8 quantise")
    def add_fp8(self) -> float:
        """The fp8 resident: the spare transformer quantised, the rest shared. Seconds."""
        from diffusers import WanPipeline

        t0 = time.perf_counter()
        p = self.pipe
        pipe8 = WanPipeline(tokenizer=p.tokenizer, text_encoder=p.text_encoder, vae=p.vae,
                            scheduler=p.scheduler, transformer=self.spare,
                            boundary_ratio=p.config.boundary_ratio,
                            expand_timesteps=p.config.expand_timesteps)
        self.fp8 = self.models.adopt(self.folder, pipe8, "fp8")
        self.fp8.decoders = self.exact.decoders  # one VAE: one set of decode graphs
        sync(self.device)
        return time.perf_counter() - t0


def run_tier(m: Model, tier: str, steps: int, base: dict[str, Any],
             ref: dict[str, Any] | None) -> dict[str, Any]:
    """One timed framefleet job at ``tier`` (after an untimed 1-step one that compiles)."""
    if not tier.endswith("cache"):  # a cache tier runs the compiled code of its base tier
        framefleet(job(m.work, m.name, gen_spec(m.folder, m.size, 1, tier), f"{tier}-warm"),
                   m.decoders, m.settings)
    if m.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(m.device)
    spec = job(m.work, m.name, gen_spec(m.folder, m.size, steps, tier), f"{tier}-{steps}")
    ff = framefleet(spec, m.decoders, m.settings)
    peak = torch.cuda.max_memory_allocated(m.device) / 2**30 if m.device.type == "cuda" else 0
    latents, files = ff.pop("latents"), ff.pop("segment_files")
    quality: dict[str, Any] = {"vs_diffusers_rel_l2": rel_l2(latents, base["latents"])}
    if ref is not None:
        quality["latents_rel_l2"] = rel_l2(latents, ref["latents"])
        quality["frames_psnr_db"] = frames_psnr(files, ref["files"])
    else:  # the exact tier is the reference; a run without it has no reference
        quality.update(latents_rel_l2=0.0 if tier == "exact" else None, frames_psnr_db=None)
    row = {**m.meta, "steps": steps, "tier": tier,
           "cache": RECOMMENDED_CACHE if tier.endswith("cache") else None,
           "framefleet_wall_s": ff["wall_s"], "diffusers_wall_s": base["wall_s"],
           "speedup": base["wall_s"] / ff["wall_s"], "denoise_s_per_step": ff["denoise_s"] / steps,
           "quality": quality, "latents_identical_to_diffusers":
           bool(torch.equal(latents, base["latents"])), "peak_gib": peak, "job_id": spec.job_id,
           "framefleet": ff}
    if tier == "exact":
        row["_ref"] = {"latents": latents, "files": files}
    row["_latents"] = latents
    return row


def refuse(m: Model, tier: str, steps: int, doc: dict[str, Any]) -> None:
    """A row this device cannot run (fp8 on the CPU): its job, built and validated as on the
    GPU, goes through ``run_job`` to the worker's own tier check, and its refusal is recorded as
    the row's skip reason. A job the worker does not refuse fails the run."""
    spec = job(m.work, m.name, gen_spec(m.folder, m.size, steps, tier), f"{tier}-{steps}")
    try:
        framefleet(spec, m.decoders, m.settings)
    except InvalidJobError as e:
        doc["skipped"].append({"what": f"{m.name} {steps} steps {tier}", "job_id": spec.job_id,
                               "reason": str(e)})
        print(f"SKIP {m.name} {steps} steps {tier}: {e}", flush=True)
        return
    doc["failed"] = True
    doc["skipped"].append({"what": f"{m.name} {steps} steps {tier}", "job_id": spec.job_id,
                           "reason": "NOT refused: the worker ran a tier its device lacks"})


def _baseline(args: argparse.Namespace, m: Model, steps: int, bases: dict[int, Any],
              budget: Budget) -> bool:
    """diffusers at ``steps`` (after one untimed 1-step call, the first time), into
    ``bases``; False when the budget has no room for it."""
    first = not bases
    est = (EST["base_fixed"] + EST["base_step"] * steps) + (EST["base_fixed"] if first else 0)
    if not budget.fits(f"{m.name} {steps} steps (diffusers)", est):
        return False
    if first:
        baseline(m.pipe, gen_spec(m.folder, m.size, 1, "exact"), m.info, m.device,
                 m.work / f"base-{m.name}-warm.mp4")
    bases[steps] = baseline(m.pipe, gen_spec(m.folder, m.size, steps, "exact"), m.info,
                            m.device, m.work / f"base-{m.name}-{steps}.mp4")
    return True


def bench_model(args: argparse.Namespace, name: str, device: torch.device, dtype: torch.dtype,
                work: Path, doc: dict[str, Any], budget: Budget, save: Any) -> None:
    tiers = list(args.tiers)
    try:
        check_tier("fp8", device)
        refused: list[str] = []
    except InvalidJobError:  # the fp8 rows still go as far as the worker's own refusal
        refused = [t for t in tiers if t.startswith("fp8")]
    m = Model(args, name, device, dtype, work, [t for t in tiers if t not in refused])
    print(json.dumps(m.meta), flush=True)
    h, w, _ = m.size
    if args.decode_graphs and device.type == "cuda":  # as a worker's warm-up does
        m.models.decoder(m.exact).warmup(h // m.info.spatial_factor, w // m.info.spatial_factor)
    # correctness first: one forward of the exact tier (compiled on CUDA) against eager,
    # unless only fp8 rows run (they have a check of their own; exact's would compile it)
    err = None
    if any(not t.startswith("fp8") for t in tiers):
        err = forward_error(m.pipe.transformer, m.pipe.transformer, m.size, m.info, device)
        doc["checks"].append({"model": name, "tier": "exact", "forward_rel_l2": err})
        doc["failed"] |= err > 2e-2
    # --order tiers: exact and cache at every step count first (cheap), then fp8 (its first
    # call quantises and compiles: minutes), so a tight budget drops the costliest rows, not the
    # most; --order steps: every tier at the first step count, then the next
    bases: dict[int, dict[str, Any]] = {}
    refs: dict[int, dict[str, Any]] = {}
    split: set[str] = set()
    passes = (["exact", "cache"], ["fp8", "fp8+cache"])
    plan = ([(steps, p) for steps in args.steps for p in passes] if args.order == "steps"
            else [(steps, p) for p in passes for steps in args.steps])
    for steps, tier_pass in plan:
        for tier in [t for t in tier_pass if t in tiers]:
            if steps not in bases and not _baseline(args, m, steps, bases, budget):
                break
            if tier in refused:
                refuse(m, tier, steps, doc)
                continue
            est = EST["ff_fixed"] + EST["ff_step"] * steps
            if tier.startswith("fp8") and m.fp8 is None:
                est += EST["fp8_prepare"]
            if not budget.fits(f"{name} {steps} steps {tier}", est):
                continue
            if tier.startswith("fp8") and m.fp8 is None:
                prep = m.add_fp8()
                ferr = forward_error(m.pipe.transformer, m.fp8.pipe.transformer, m.size,
                                     m.info, device)
                doc["checks"].append({"model": name, "tier": "fp8", "forward_rel_l2": ferr,
                                      "prepare_s": prep})
            try:
                row = run_tier(m, tier, steps, bases[steps], refs.get(steps))
            except NonFiniteOutput as e:  # the guard stopped the job: a row that says so
                doc["failed"] = True
                save({**m.meta, "steps": steps, "tier": tier, "nonfinite": str(e)},
                     "nonfinite")
                continue
            if "_ref" in row:
                refs[steps] = row.pop("_ref")
            latents = row.pop("_latents")
            if args.previews and budget.fits(f"{name} {steps} steps {tier} previews", est):
                every = {"every": args.previews}
                spec = job(m.work, m.name, gen_spec(m.folder, m.size, steps, tier,
                                                    preview=every),
                           f"{tier}-{steps}-pv{args.previews}")
                row["previews"] = gen_previews.measure(m, spec, row, latents, Path(args.out),
                                                       Path(args.json).stem)
            row["diffusers"] = {k: v for k, v in bases[steps].items() if k != "latents"}
            row["quality"]["forward_rel_l2"] = (doc["checks"][-1]["forward_rel_l2"]
                                                if tier.startswith("fp8") else err)
            print(json.dumps({k: row[k] for k in ("model", "steps", "tier", "speedup",
                                                  "denoise_s_per_step")}), flush=True)
            save(row)
            base = "fp8" if tier.startswith("fp8") else "exact"
            if args.split and base not in split:  # the resident's kernels by class, once
                split.add(base)
                resident = m.exact if base == "exact" or m.fp8 is None else m.fp8
                save({**m.meta, "tier": base, **gen_split.split(
                    resident.pipe.transformer, m.size, m.info, device)}, "split")
    gen_extra.extras(args, m, doc, budget, save)
    del m
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--models", default="wan2.2-ti2v-5b,wan2.1-t2v-1.3b")
    ap.add_argument("--steps", default=None, type=lambda s: [int(v) for v in s.split(",")],
                    help="step counts (default 20,4; --tiny: 4)")
    ap.add_argument("--tiers", default="exact,fp8,cache,fp8+cache",
                    type=lambda s: s.split(","))
    ap.add_argument("--order", choices=["tiers", "steps"], default="tiers",
                    help="tiers: exact and cache at every step count, then fp8; steps: every "
                    "tier at the first step count, then the next")
    ap.add_argument("--size", default=None, help="HxWxF for every model (default: its own)")
    ap.add_argument("--decode-graphs", type=int, default=0,
                    help="framefleet's compiled decode graphs (FRAMEFLEET_DECODE_GRAPHS)")
    ap.add_argument("--image", default=None, metavar="MODEL",
                    help="also an image-to-video job on this model (a TI2V preset)")
    ap.add_argument("--image-steps", type=int, default=4)
    ap.add_argument("--lora", default=None, metavar="MODEL", help="also a LoRA switch's cost")
    ap.add_argument("--previews", type=int, default=0, metavar="N",
                    help="also each framefleet row with a preview every N steps (0: not)")
    ap.add_argument("--split", action="store_true",
                    help="also one forward per tier by kernel class (attention, GEMM, other)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="stop in time: skip what does not fit (default: BUDGET env, or none)")
    ap.add_argument("--tiny", action="store_true",
                    help="CPU-sized: the tiny and tiny-ti2v presets, 4 steps (CI)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--json", default="generate.json", help="file name under --out")
    ap.add_argument("--out", required=True, help="folder for the JSON")
    args = ap.parse_args()
    if args.budget_s is None and os.environ.get("BUDGET"):
        args.budget_s = float(os.environ["BUDGET"])
    if args.tiny:  # the 1.3B and TI2V-5B layouts in miniature, the same code paths
        args.models, args.steps = "tiny-ti2v,tiny", args.steps or [4]
        args.image = args.image and "tiny-ti2v"
        args.lora = args.lora and "tiny-ti2v"
        args.image_steps = min(args.image_steps, 4)
    args.steps = args.steps or [20, 4]
    return args


def main() -> int:
    args = parse_args()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    use_compile_cache(os.environ.get("FRAMEFLEET_COMPILE_CACHE_DIR"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import diffusers

    doc: dict[str, Any] = {
        "command": " ".join(["python", *sys.argv]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        **device_report(device), "diffusers": diffusers.__version__, "dtype": str(dtype),
        "weights": "random (seeded): quality figures measure arithmetic error only",
        "recommended_cache": RECOMMENDED_CACHE, "rows": [], "checks": [], "extras": [],
        "split": [],
        "skipped": [], "nonfinite": [], "failed": False,
    }
    budget = Budget(args.budget_s, doc, TINY_EST_SCALE if args.tiny else 1.0)

    def save(row: dict[str, Any] | None, key: str = "rows") -> None:
        if row is not None:
            doc[key].append(row)
        write_json(out / args.json, doc)

    with tempfile.TemporaryDirectory(prefix="ff-gen-bench-") as tmp:
        for name in args.models.split(","):
            if not budget.fits(f"{name} (build and first rows)", EST["build"] + 60):
                continue
            bench_model(args, name, device, dtype, Path(tmp), doc, budget, save)
            save(None)
    if device.type == "cpu":  # the exact tier is eager here: bit-identical to diffusers
        doc["failed"] |= not all(r["latents_identical_to_diffusers"] for r in doc["rows"]
                                 if r["tier"] == "exact")
    save(None)
    (out / Path(args.json).with_suffix(".md").name).write_text(markdown(doc))
    print(table(doc["rows"]))
    for extra in doc["extras"]:
        keys = ("model", "kind", "steps", "denoise", "speedup", "latents_identical_to_diffusers",
                "latents_rel_l2_vs_diffusers", "set_adapters_s", "runs")
        print(json.dumps({k: extra[k] for k in keys if k in extra}, default=str))
    for skip in doc["skipped"]:
        print(f"skipped: {skip['what']}: {skip['reason']}")
    return 1 if doc["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
