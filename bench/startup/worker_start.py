"""Worker start from a downloaded-style model folder: what a new host of an autoscaling group
pays, against diffusers' loading and the disk's own speed.

Writes random weights at real size in the published Wan2.2-TI2V-5B layout and dtypes
(transformer float32 in 5 shards with its index, UMT5-XXL bfloat16 in 3 shards, the VAE in
one file, tokenizer, scheduler; about 34 GB) to ``--folder`` on local disk, then, in one run:

- ``raw read``: every weight file read by parallel ``cat``s after ``echo 3 >
  /proc/sys/vm/drop_caches`` (where the machine allows it: the results say whether it did);
- the load methods of ``load_methods.py``, each in a fresh process, page cache warm and
  dropped: diffusers' ``from_pretrained(dtype=bfloat16)`` then ``.to(device)`` (always: the
  reference of exactness), and what ``--methods`` adds (``device_map``, the worker's fast path
  at each of ``--threads-list``, ``fastsafetensors`` where installed): seconds, peak host RSS,
  a digest of every tensor against diffusers'; the fastest bit-identical one is "chosen";
- the worker's start rows (``start_rows.py``, each start a fresh ``start_child.py``: the pool
  process's start path without Celery or a broker, to ready, then a first and a second job):
  with no artifact and an empty compile cache; ``framefleet compile``; with the artifact and
  an empty compile cache, page cache warm, then dropped. Each gives its phases and its critical
  path, hit or miss per transformer size and per decoder graph, and both jobs' seconds;
  ``targets`` checks them against the scale-up targets.

Writes ``worker-start-<gpu>.json`` and ``.md`` to ``--out``. ``--no-start`` leaves the start
rows out (the load methods only).

``--tiny``: the same on the CPU with the layout in miniature (CI runs it, every row; the
transformer compiles with inductor's C++ backend, the decoder has no graphs, the page cache
is not dropped; nothing measured). Each start's process must exit 0 with nothing left running:
one that aborts at exit (``terminate called without an active exception``) fails the run.

    python bench/startup/worker_start.py --folder /mnt/local/wan5b --methods none \
        --threads-list 16 --out bench/results
    python bench/startup/worker_start.py --folder /mnt/local/wan5b --no-start --threads-list 4,16
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.startup import load_methods, start_rows  # noqa: E402  (the root is on the path now)

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


def table(doc: dict[str, Any]) -> str:
    lines = [f"# Worker start, {doc['device']}", "", f"`{doc['command']}`, {doc['date']}; "
             f"{doc['bytes'] / 1e9:.1f} GB written in {doc['write_s']:.1f} s", ""]
    if doc.get("starts"):
        lines += start_rows.table(doc)
        for name, row in doc["starts"].items():
            for job in ("first", "second"):
                stages = ", ".join(f"{k.removesuffix('_s')} {v:.1f}"
                                   for k, v in row.get(f"{job}_job_stages", {}).items())
                lines.append(f"\n{job.capitalize()} job, {name.replace('_', ' ')}: {stages}")
    if doc.get("load_methods"):
        lines += ["", load_methods.table(doc["load_methods"]).rstrip("\n")]
    return "\n".join(lines) + "\n"


def result_name(device: str, tiny: bool) -> str:
    """``worker-start-<gpu>``: tiny, h200, h100, or the device's name."""
    if tiny:
        return "worker-start-tiny"
    return "worker-start-" + next((g.lower() for g in ("H200", "H100") if g in device), device)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--folder", type=Path, help="where to write the model (local disk)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--tiny", action="store_true", help="CPU, the layout in miniature")
    ap.add_argument("--device", default=None)
    ap.add_argument("--methods", default="all",
                    help="load methods to compare: all, none, or a comma list of "
                         f"{', '.join(load_methods.METHODS)}, fast:N (diffusers is the "
                         "reference of exactness and the targets' baseline: it runs "
                         "whenever the start rows do)")
    ap.add_argument("--threads-list", default=",".join(map(str, load_methods.THREADS)),
                    help="thread counts of the fast method (default %(default)s); the most "
                    "of them reads in the worker's start and in the raw read")
    ap.add_argument("--no-start", action="store_true",
                    help="skip the worker's start rows (the load methods only)")
    args = ap.parse_args()
    from bench.report import device_name, write_json

    device = args.device or ("cpu" if args.tiny else "cuda")
    threads = [int(n) for n in args.threads_list.split(",") if n.strip()]
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
                           "bytes": written, "write_s": time.perf_counter() - t,
                           "threads": max(threads)}
    if device == "cuda":
        doc["device"] = device_name("cuda")
    doc["raw_read"] = start_rows.raw_read(folder, max(threads), drop=not args.tiny)
    caches = [("warm", False)] + ([] if args.tiny else [("cold", True)])
    doc["load_methods"] = load_methods.compare(folder, device, methods, caches)
    doc["dropped_caches"] = doc["raw_read"]["dropped"] or any(
        r.get("dropped") for r in doc["load_methods"]["rows"])
    name = result_name(doc["device"], args.tiny)
    write_json(args.out / f"{name}.json", doc)  # again after each row: a stopped run keeps them
    if not args.no_start:  # a failed row ends the run here, the rows so far written
        doc.update(start_rows.start_rows(folder, device, args.tiny, max(threads), lambda
                                         rows: write_json(args.out / f"{name}.json",
                                                          {**doc, **rows})))
        doc["targets"] = start_rows.targets(doc)
    write_json(args.out / f"{name}.json", doc)
    (args.out / f"{name}.md").write_text(table(doc))
    print(table(doc))


if __name__ == "__main__":
    main()
