"""Worker start from a downloaded-style model folder: diffusers' loading against framefleet's.

Writes random weights at real size in the published Wan2.2-TI2V-5B layout and dtypes
(transformer float32 in 5 shards with its index, UMT5-XXL bfloat16 in 3 shards, the VAE in
one file, tokenizer, scheduler; about 31 GB) to ``--folder`` on local disk, then times, each in
a fresh process:

- the load methods of ``load_methods.py``: diffusers' ``from_pretrained(dtype=bfloat16)`` then
  ``.to(device)``, its ``device_map=device``, the worker's fast path at each of
  ``--threads-list``, and ``fastsafetensors`` where installed: seconds to the models on the
  device, peak host RSS, and a digest of every tensor against diffusers'; the fastest
  bit-identical one, after a dropped page cache, is the "chosen" line, with the reason;
- framefleet: the worker's start path (imports, the decoder cache, the warm-up with the folder
  as ``FRAMEFLEET_WARMUP_MODEL``, load method fast) to ready, then one job to its end: the
  phases of ``framefleet_worker_start_seconds``, against the diffusers row above. In one
  process without Celery or a broker: the pool process's own start, not the broker
  connection (``--no-start`` leaves it out).

Each once with the page cache warm (just written) and once after ``echo 3 >
/proc/sys/vm/drop_caches`` where the machine allows it (the results say whether it did).
Writes ``worker-start-<device>.json`` and ``.md`` to ``--out``. ``--methods`` picks the load
methods (``all``, ``none`` or a list: ``diffusers,fast:8,fastsafetensors``), so that a device
run stays bounded; diffusers always runs with the start rows (their baseline) and is the
reference of exactness: without it no method is chosen.

``--tiny``: the same on the CPU with the layout in miniature (CI runs it; nothing measured).
Either way the framefleet child must exit 0 with nothing left running: a child that aborts at
exit (``terminate called without an active exception``) fails the run.

    python bench/startup/worker_start.py --folder /mnt/local/wan5b --out bench/results
    python bench/startup/worker_start.py --folder /mnt/local/wan5b --no-start --threads-list 4,16
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.startup import load_methods  # noqa: E402  (the root is on the path now)

#: component → (stored dtype, shards), as the published 5B folder has them
LAYOUT = {"transformer": ("float32", 5), "text_encoder": ("bfloat16", 3), "vae": ("float32", 1)}
STEMS = {"transformer": "diffusion_pytorch_model", "vae": "diffusion_pytorch_model",
         "text_encoder": "model"}


def write_folder(folder: Path, preset: str, device: str) -> int:
    """Configs of ``preset`` and random weights in the published layout; returns bytes."""
    import torch
    from safetensors.torch import save_file

    from worker.generate.model.presets import build_pipeline, save_configs

    pipe = build_pipeline(preset, device="meta")
    save_configs(pipe, folder)
    total = 0
    gen = torch.Generator(device).manual_seed(0)
    for name, (dtype_name, count) in LAYOUT.items():
        dtype = getattr(torch, dtype_name)
        module = getattr(pipe, name)
        # tied weights once: keep_vars gives the parameters themselves (state_dict()'s
        # detached copies are new objects each, and a tie written twice with different
        # random values is left untied by transformers, tied by the fast path)
        state = module.state_dict(keep_vars=True)
        seen: set[int] = set()
        shapes = {}
        for key, t in state.items():
            if id(t) not in seen:
                seen.add(id(t))
                shapes[key] = (tuple(t.shape), t.dtype)
        size = sum(torch.Size(s).numel() * (dtype.itemsize if d.is_floating_point else
                                            d.itemsize) for s, d in shapes.values())
        limit = -(-size // count)
        names = [f"{STEMS[name]}.safetensors"] if count == 1 else [
            f"{STEMS[name]}-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]
        groups: list[list[str]] = [[]]
        used = 0
        for key, (shape, stored) in shapes.items():
            nbytes = torch.Size(shape).numel() * (dtype.itemsize if stored.is_floating_point
                                                  else stored.itemsize)
            if groups[-1] and used + nbytes > limit and len(groups) < count:
                groups.append([])
                used = 0
            groups[-1].append(key)
            used += nbytes
        weight_map = {}
        for shard_name, keys in zip(names, groups, strict=False):
            tensors = {}
            for key in keys:  # made on the device (fast), written from the host
                shape, stored = shapes[key]
                tensors[key] = ((torch.randn(shape, generator=gen, device=device) * 0.02)
                                .to(dtype).cpu() if stored.is_floating_point
                                else torch.zeros(shape, dtype=stored))
            save_file(tensors, str(folder / name / shard_name), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(keys, shard_name))
        if count > 1:
            (folder / name / f"{STEMS[name]}.safetensors.index.json").write_text(json.dumps(
                {"metadata": {"total_size": size}, "weight_map": weight_map}))
        total += size
    return total


def _child(folder: str, device: str, started: float, tiny: bool,
           threads: int = 8) -> dict[str, Any]:
    """Runs in a fresh process: the worker's start to ready, then its first job, timed.
    ``threads``: ``FRAMEFLEET_LOAD_THREADS`` (the most of ``--threads-list``: the load
    methods' rows above read with as many; the worker's default is 8)."""
    out: dict[str, Any] = {"mode": "framefleet", "load_threads": threads}
    import logging
    import tempfile

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(relativeCreated)d ms %(levelname)s %(name)s: %(message)s")

    import torch  # noqa: F401  (counted as imports)

    from producer.settings import Settings
    from producer.wire.spec import GenerateSpec, JobSpec, OutputSpec, VideoSpec
    from worker.lifecycle import warmup
    from worker.run import Run, default_decoders, run_job

    hook = time.time()
    size = "64x64x9" if tiny else "704x1280x121"
    settings = Settings(device=device, warmup_model=folder, load_method="fast",
                        load_threads=threads,
                        warmup_generate_sizes=size,  # the CPU runs eager: nothing compiles
                        work_dir=tempfile.mkdtemp(), file_roots=str(Path(folder).parent))
    decoders = default_decoders(settings)
    state = warmup.warm_up(decoders, settings, started=started,
                           phases={"imports": hook - started, "init": time.time() - hook})
    out["phases"], out["ready_s"] = state.phases, time.time() - started
    out["weights_to_device_s"] = state.phases["read"] + state.phases["cast_move"]
    h, w, f = (int(v) for v in size.split("x"))
    # Under the roots, beside the model; a folder of its own per run, so that no run finds an
    # earlier run's output and returns it unchanged (``reused``: it did, in 2 ms, on the H200).
    outputs = Path(tempfile.mkdtemp(prefix="outputs-", dir=Path(folder).parent))
    spec = JobSpec(job_id="first", output=OutputSpec(uri=outputs.as_uri()),
                   video=VideoSpec(segment_frames=4 if tiny else 16), generate=GenerateSpec(
                       model=Path(folder).as_uri(), prompt="a red fox in the snow", height=h,
                       width=w, num_frames=f, num_inference_steps=2, guidance_scale=1.0))
    t = time.perf_counter()
    result = run_job(spec, decoders, Run(spec, settings=settings))
    out["first_job_s"] = time.perf_counter() - t
    if result.reused:  # not a first job: nothing was generated
        raise SystemExit(f"the first job reused an earlier output: {result.manifest_uri}")
    out["first_job_segments"] = len(result.manifest.segments)
    out["first_job_stages"] = {k: round(v, 3) for k, v in result.timings.model_dump().items()
                               if isinstance(v, float) and v > 0}
    out["first_job_end_s"] = time.time() - started
    return out


def _exit_child(out: dict[str, Any]) -> None:
    """The child's end, clean: what the worker's start left running is stopped, as a pool
    process stops it (``worker.lifecycle.shutdown``: compile workers, monitors), and the
    threads still running are reported (``threads_left``). One is a decode graph still
    building in the background for the job's new size (CUDA): it is abandoned, since the
    process is done and joining it would cost its whole compile, and an interpreter torn
    down under a live compile or CUDA thread aborts (``terminate called without an active
    exception``); so the child then ends at once with status 0, its output flushed."""
    from worker.lifecycle.shutdown import stop_process

    out["threads_left"] = left = stop_process()
    print(json.dumps(out), flush=True)
    if left:
        sys.stderr.flush()
        os._exit(0)


def run_child(folder: Path, device: str, tiny: bool, threads: int = 8) -> dict[str, Any]:
    started = time.time()
    cmd = [sys.executable, __file__, "--child", "framefleet", "--folder", str(folder),
           "--device", device, "--started", repr(started), "--threads-list", str(threads),
           *(["--tiny"] if tiny else [])]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=3600)
    if done.returncode != 0 or "terminate called" in done.stderr:
        raise SystemExit(f"framefleet run failed (exit status {done.returncode}):\n"
                         f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    out = dict(json.loads(done.stdout.strip().splitlines()[-1]))
    # the worker's log of its start and job (timed lines): the figures' explanation where
    # one is needed
    out["log_tail"] = [line[:300] for line in done.stderr.splitlines()
                       if not line.startswith((" ", "\t"))][-40:]
    return out


def table(doc: dict[str, Any]) -> str:
    lines = [f"# Worker start, {doc['device']}", "", f"`{doc['command']}`, {doc['date']}; "
             f"{doc['bytes'] / 1e9:.1f} GB written in {doc['write_s']:.1f} s; page cache "
             f"dropped: {doc['dropped_caches']}", ""]
    if doc["runs"]:
        lines += ["| page cache | diffusers from_pretrained | .to(device) | diffusers weights | "
                  "framefleet weights | ready | first job end | framefleet phases |",
                  "|---|---|---|---|---|---|---|---|"]
    for run in doc["runs"]:
        d, f = run["diffusers"], run["framefleet"]
        phases = ", ".join(f"{k} {v:.1f}" for k, v in f["phases"].items() if k != "total")
        lines.append(f"| {run['cache']} | {d['from_pretrained_s']:.1f} s | "
                     f"{d['to_device_s']:.1f} s | {d['weights_to_device_s']:.1f} s | "
                     f"{f['weights_to_device_s']:.1f} s | {f['ready_s']:.1f} s | "
                     f"{f['first_job_end_s']:.1f} s | {phases} |")
    for run in doc["runs"]:
        stages = ", ".join(f"{k.removesuffix('_s')} {v:.1f}"
                           for k, v in run["framefleet"].get("first_job_stages", {}).items())
        lines.append(f"\nFirst job, page cache {run['cache']}: {stages}")
    if doc.get("load_methods"):
        lines += ["", load_methods.table(doc["load_methods"]).rstrip("\n")]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--folder", type=Path, help="where to write the model (local disk)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--tiny", action="store_true", help="CPU, the layout in miniature")
    ap.add_argument("--device", default=None)
    ap.add_argument("--methods", default="all",
                    help="load methods to compare: all, none, or a comma list of "
                         f"{', '.join(load_methods.METHODS)}, fast:N (diffusers is the "
                         "reference of exactness and the start rows' baseline: it runs "
                         "whenever the start rows do)")
    ap.add_argument("--threads-list", default=",".join(map(str, load_methods.THREADS)),
                    help="thread counts of the fast method (default %(default)s)")
    ap.add_argument("--no-start", action="store_true",
                    help="skip the worker's start to its first job (the load methods only)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--started", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    from bench.report import device_name, write_json

    device = args.device or ("cpu" if args.tiny else "cuda")
    threads = [int(n) for n in args.threads_list.split(",") if n.strip()]
    if args.child:
        _exit_child(_child(str(args.folder), device, args.started, args.tiny, max(threads)))
        return
    methods = [] if args.methods == "none" else load_methods.parse_methods(args.methods,
                                                                            threads)
    if not args.no_start and "diffusers" not in methods:
        methods.insert(0, "diffusers")
    if not methods:
        raise SystemExit("--methods none with --no-start: nothing to run")
    import tempfile

    folder = args.folder or Path(tempfile.mkdtemp()) / "wan22-ti2v-5b"
    if folder.exists() and any(folder.iterdir()):
        raise SystemExit(f"{folder}: exists and is not empty")
    t = time.perf_counter()
    written = write_folder(folder, "tiny-ti2v" if args.tiny else "wan2.2-ti2v-5b", device)
    doc: dict[str, Any] = {"command": " ".join(["python", *sys.argv]), "device": device,
                           "date": datetime.now(UTC).isoformat(timespec="seconds"),
                           "bytes": written, "write_s": time.perf_counter() - t, "runs": []}
    if device == "cuda":
        doc["device"] = device_name("cuda")
    caches = [("warm", False)] + ([] if args.tiny else [("cold", True)])
    doc["load_methods"] = compared = load_methods.compare(folder, device, methods, caches)
    rows = compared["rows"]
    doc["dropped_caches"] = any(r.get("dropped") for r in rows)
    for cache, drop in [] if args.no_start else caches:
        run: dict[str, Any] = {"cache": cache, "diffusers": next(
            r for r in rows if r["cache"] == cache and r["method"] == "diffusers")}
        if run["diffusers"]["status"] != "ok":
            raise SystemExit(f"diffusers {cache}: {run['diffusers']['status']}")
        if drop:
            run["framefleet_dropped"] = dropped = load_methods.drop_caches()
            doc["dropped_caches"] = doc["dropped_caches"] or dropped
        run["framefleet"] = run_child(folder, device, args.tiny, max(threads))
        doc["runs"].append(run)
    name = "worker-start-" + ("tiny" if args.tiny else "h200" if "H200" in doc["device"]
                              else device)
    write_json(args.out / f"{name}.json", doc)
    (args.out / f"{name}.md").write_text(table(doc))
    print(table(doc))


if __name__ == "__main__":
    main()
