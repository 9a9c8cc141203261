"""Worker start benchmark: process start → ready (first graph replay), cold and warm.

Starts fresh Python processes that do what a worker's pool process does at start
(``default_decoders`` + ``worker.lifecycle.warmup.warm_up``: import, build the warm-up
decoder, compile and capture every warm-up size, one short decode replaying the graph) with one
``FRAMEFLEET_COMPILE_CACHE_DIR``: the first run finds it empty (cold), the next ones find what
the first left (warm: a restarted worker; a run is "cold" when the cache folder is empty at its
start). The clock starts before the process is spawned. Each start is broken down in the order
it happens: interpreter, ``import torch``, the worker's modules, the CUDA context, diffusers'
import chain (``from diffusers import AutoencoderKLWan``), ``torch._dynamo``, building the
decoder, then per size the graph's history / compile / warm / capture.

``--lean DIR``: the children run in a virtualenv at DIR (made once) whose site-packages holds
only the distributions ``framefleet[worker]`` needs, linked from this interpreter's, with
bytecode kept under DIR: what the worker image holds (``pip install .[worker]``, compiled), not
a big image's hundreds of packages (``importlib.metadata`` scans all of them). The first run in
a new DIR writes the bytecode (flagged ``bytecode_written``).

  python bench/startup/warm_start.py --decoder wan2.2-vae --sizes 44x80 --runs 2 --cache DIR \
      --lean /tmp/lean --out warm_start.json

``--load-probe`` instead times the ways of building the decoder itself, each in a fresh process
(random init on the CPU or on the GPU; ``from_pretrained`` of a saved folder with diffusers'
loading options), and checks that every folder load gives the same weights.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def child() -> None:
    """One worker start; prints one JSON line."""
    t = {"start": time.time()}
    sys.path.insert(0, str(ROOT))
    import torch

    t["torch"] = time.time()
    from producer.settings import get_settings
    from worker.lifecycle import warmup
    from worker.run import default_decoders

    t["worker_modules"] = time.time()
    cuda = os.environ.get("FRAMEFLEET_DEVICE", "cuda") == "cuda"
    if cuda:
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
    t["cuda_context"] = time.time()
    # What the decoder build imports first, each timed on its own (the build then finds them):
    # torch.compile's dynamo (diffusers imports it too), then diffusers' own chain.
    import torch._dynamo

    t["dynamo_import"] = time.time()
    from diffusers import AutoencoderKLWan  # noqa: F401

    t["diffusers_import"] = time.time()
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
    if cuda:
        torch.cuda.synchronize()
    t["ready"] = time.time()
    first_graph_s = None
    if os.environ.get("BENCH_WAIT_FIRST"):  # the first-chunk graph, built after ready
        for decoder in list(decoders._cache.values()):
            graphs = getattr(decoder, "graphs", None)
            if graphs is not None:
                graphs.wait(timeout=600)
        first_graph_s = time.time() - t["ready"]
    from torch._dynamo.utils import compile_times, counters

    spawn = float(os.environ["BENCH_SPAWN_T"])
    names = list(t)
    phases = {"interpreter": t["start"] - spawn,
              **{b: t[b] - t[a] for a, b in itertools.pairwise(names)}}
    phases["decoder_build"] = state.build_s
    # What remains of warm_up: the graphs (their phases per size below), the short decode.
    phases["graphs"] = phases.pop("ready") - state.build_s
    print(json.dumps({
        "start_to_first_replay_s": t["ready"] - spawn, "phases_s": phases,
        "warm_up_s": state.seconds, "decoder_build_s": state.build_s, "sizes": state.sizes,
        "first_graph_after_ready_s": first_graph_s, "python": sys.executable,
        "distributions": len(list(importlib.metadata.distributions())),
        "compile_times_s": {k: round(float(v), 3) for k, v in
                            zip(*compile_times(repr="csv", aggregate=True), strict=True)
                            if float(v) >= 0.05},
        "inductor_counters": {k: v for k, v in counters["inductor"].items()
                              if "cache" in k},
        "aot_autograd_counters": {k: v for k, v in counters["aot_autograd"].items()
                                  if "cache" in k},
    }), flush=True)


def _requirements() -> list[str]:
    """``framefleet[worker]``'s requirements, from pyproject.toml."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *project["optional-dependencies"]["worker"]]


def lean_env(folder: Path) -> tuple[Path, dict[str, Any]]:
    """A virtualenv at ``folder`` linking only what ``framefleet[worker]`` needs (recursively,
    markers and extras evaluated) from this interpreter's distributions; its python and what
    went in (and what this interpreter lacks)."""
    import importlib.metadata as md
    import venv

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    python = folder / "bin" / "python"
    if not python.exists():
        venv.EnvBuilder(with_pip=False, symlinks=True).create(folder)
    site = Path(subprocess.check_output(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        text=True).strip())
    todo = [Requirement(r) for r in _requirements()]
    seen: dict[str, set[str]] = {}
    linked, missing = [], []
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        extras = set(req.extras)
        if name in seen and extras <= seen[name]:
            continue
        seen[name] = seen.get(name, set()) | extras
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            missing.append(req.name)
            continue
        for text in dist.requires or []:
            sub = Requirement(text)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e})
                                         for e in (seen[name] or {""})):
                todo.append(sub)
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in sorted(tops - {"__pycache__"}):
            link, target = site / top, Path(str(dist.locate_file(top)))
            if not link.exists() and target.exists():
                link.symlink_to(target)
        linked.append(f"{dist.metadata['Name']}=={dist.version}")
    return python, {"folder": str(folder), "linked": sorted(set(linked)),
                    "missing": sorted(set(missing))}


def _save_weights(decoder: str, work: str) -> str:
    """A diffusers-layout folder of the decoder's architecture (seeded random weights, built on
    the GPU and saved in bf16): what a worker's FRAMEFLEET_WARMUP_WEIGHTS names."""
    sys.path.insert(0, str(ROOT))
    import torch
    from diffusers import AutoencoderKLWan

    from producer.wire.spec import DecoderSpec
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
    from producer.wire.spec import DecoderSpec

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
    ap.add_argument("--lean", default=None, metavar="DIR",
                    help="run the starts in a virtualenv at DIR holding only the worker's "
                    "dependencies (made once), bytecode kept in DIR")
    ap.add_argument("--wait-first", action="store_true",
                    help="the last run also waits for the first-chunk graph (after ready)")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the orchestration")
    args = ap.parse_args()
    if args.child:
        child()
        return
    if args.probe_child:
        probe_child(*args.probe_child)
        return
    sys.path.insert(0, str(ROOT))
    from bench.report import device_report, write_json

    cache = args.cache or tempfile.mkdtemp(prefix="compile-cache-")
    work = tempfile.mkdtemp(prefix="work-")
    if args.load_probe:
        import torch

        probe = {"command": "python " + " ".join(sys.argv),
                 "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                 **device_report("cuda"), "decoder": args.decoder, **load_probe(args, work)}
        write_json(args.out, probe)
        return
    runs: list[dict[str, Any]] = []
    extra: dict[str, str] = {}
    if args.weights:
        folder = _save_weights(args.decoder, work)
        extra = {"FRAMEFLEET_WARMUP_WEIGHTS": Path(folder).as_uri(),
                 "FRAMEFLEET_FILE_ROOTS": work}
    profile = Path(args.out).with_suffix(".profile.txt") if args.profile else None
    python, lean, base_env = Path(sys.executable), None, dict(os.environ)
    pycache: Path | None = None
    if args.lean:
        python, lean = lean_env(Path(args.lean))
        print(json.dumps({"lean": lean}), flush=True)
        pycache = Path(args.lean) / "pycache"
        # Only the repository on the path; bytecode written and read as an image's would be.
        base_env = {k: v for k, v in os.environ.items()
                    if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONHOME")}
        base_env.update(PYTHONPATH=str(ROOT), PYTHONPYCACHEPREFIX=str(pycache))
    for i in range(args.runs + (1 if profile else 0)):
        cold = not any(p.is_file() for p in Path(cache).rglob("*"))
        fresh_pyc = pycache is not None and not pycache.exists()
        env = {**base_env, **extra, "FRAMEFLEET_WARMUP_DECODER": args.decoder,
               "FRAMEFLEET_WARMUP_LATENT_SIZE": args.sizes, "FRAMEFLEET_COMPILE_CACHE_DIR": cache,
               "FRAMEFLEET_WORK_DIR": work, "FRAMEFLEET_DEVICE": args.device,
               "FRAMEFLEET_DECODE_GRAPHS": "2"}
        if profile is not None and i == args.runs:
            env["BENCH_PROFILE"] = str(profile)
        if args.wait_first and i == args.runs - 1:
            env["BENCH_WAIT_FIRST"] = "1"
        env["BENCH_SPAWN_T"] = repr(time.time())
        done = subprocess.run([str(python), __file__, "--child"], env=env, text=True,
                              capture_output=True, timeout=600, check=False)
        if done.returncode != 0:
            runs.append({"run": i, "error": done.stderr[-3000:]})
            print(done.stderr[-3000:], flush=True)
            break
        row = json.loads(done.stdout.strip().splitlines()[-1])
        row["run"] = "profiled" if "BENCH_PROFILE" in env else ("cold" if cold else f"warm{i}")
        row["bytecode_written"] = fresh_pyc
        runs.append(row)
        print(json.dumps(row), flush=True)
    import torch

    out = {"command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
           "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
           "torch": torch.__version__,
           "decoder": args.decoder, "sizes": args.sizes, "weights_folder": args.weights,
           "lean": lean, "runs": runs}
    write_json(args.out, out)
    for r in runs:
        if "error" not in r:
            parts = ", ".join(f"{k} {v:.2f}" for k, v in r["phases_s"].items())
            graph = "; ".join(f"{s['size']}: " + ", ".join(f"{k} {v:.2f}" for k, v in
                                                           s["phases"].items())
                              for s in r["sizes"])
            print(f"{r['run']}{' (bytecode written)' if r['bytecode_written'] else ''}: "
                  f"ready in {r['start_to_first_replay_s']:.1f} s = {parts} [{graph}]"
                  + (f"; first-chunk graph {r['first_graph_after_ready_s']:.1f} s after ready"
                     if r.get("first_graph_after_ready_s") is not None else ""))


if __name__ == "__main__":
    main()
