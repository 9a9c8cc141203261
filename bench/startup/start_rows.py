"""The scale-up rows of ``worker_start.py``: what a new host of an autoscaling group pays.

In one run, on one folder in the published 5B layout (``--tiny``: the layout in miniature, on
the CPU):

1. ``raw read``: every weight file read by ``--threads`` parallel ``cat``s after
   ``drop_caches`` (where the machine allows it: recorded): the disk's own speed;
2. ``no artifact``: the worker's start (``start_child.py``) with an empty compile cache and no
   artifact, page cache warm: everything compiles;
3. ``framefleet compile``: ``python -m worker compile`` of the warm-up size into the folder's
   ``compiled/`` (the transformer, and on CUDA the decoder's two graphs), with the compile
   cache of the row before (so its seconds are a warm cache's: recorded), its seconds and the
   artifact's bytes;
4. ``artifact, page cache warm``: the start with a fresh, empty compile cache and the artifact;
5. ``artifact, page cache dropped`` (not ``--tiny``): the same after ``drop_caches``.

Each start row ends with a first job and a second one like it. ``targets`` holds the issue's
four checks, each with the figures it compares.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.startup.load_methods import drop_caches

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("start_child.py")


def raw_read(folder: Path, threads: int, drop: bool) -> dict[str, Any]:
    """Every ``*.safetensors`` of ``folder`` read by ``threads`` parallel ``cat``s."""
    files = sorted(str(p) for p in folder.rglob("*.safetensors"))
    dropped = drop_caches() if drop else False
    t = time.perf_counter()
    subprocess.run(["xargs", "-0", "-P", str(threads), "-n", "1", "cat"],
                   input="\0".join(files).encode(), stdout=subprocess.DEVNULL, check=True)
    seconds = time.perf_counter() - t
    size = sum(os.path.getsize(f) for f in files)
    return {"files": len(files), "bytes": size, "seconds": seconds, "dropped": dropped,
            "gb_per_s": size / 1e9 / seconds}


def run_child(folder: Path, device: str, tiny: bool, threads: int,
              cache_dir: Path) -> dict[str, Any]:
    """One start in a fresh process, its compile cache in ``cache_dir``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (
        str(ROOT), os.environ.get("PYTHONPATH")))),
        "FRAMEFLEET_COMPILE_CACHE_DIR": str(cache_dir)}
    started = time.time()
    cmd = [sys.executable, str(CHILD), "--folder", str(folder), "--device", device,
           "--started", repr(started), "--threads", str(threads), *(["--tiny"] if tiny else [])]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=3600,
                          env=env)
    if done.returncode != 0 or "terminate called" in done.stderr:
        raise SystemExit(f"framefleet run failed (exit status {done.returncode}):\n"
                         f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    out = dict(json.loads(done.stdout.strip().splitlines()[-1]))
    # the worker's log of its start and jobs (timed lines): the figures' explanation
    out["log_tail"] = [line[:400] for line in done.stderr.splitlines()
                       if not line.startswith((" ", "\t"))][-40:]
    return out


def compile_row(folder: Path, size: str, cache_dir: Path) -> dict[str, Any]:
    """``python -m worker compile`` (what ``framefleet compile`` runs) of ``size``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (
        str(ROOT), os.environ.get("PYTHONPATH")))),
        "FRAMEFLEET_COMPILE_CACHE_DIR": str(cache_dir)}
    cmd = [sys.executable, "-m", "worker", "compile", "--model", str(folder), "--tiers",
           "exact", "--sizes", size]
    t = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=1800,
                          env=env, cwd=ROOT)
    seconds = time.perf_counter() - t
    if done.returncode != 0:
        raise SystemExit(f"compile failed ({done.returncode}): {done.stderr[-3000:]}")
    index = json.loads((folder / "compiled" / "index.json").read_text())
    (entry,) = index["artifacts"]
    said = re.search(r"compiled \S+ ([0-9.]+) s", done.stdout)
    return {"command": " ".join(["python", *cmd[1:]]), "seconds": seconds,
            "transformer_s": float(said[1]) if said else None, "bytes": entry["bytes"],
            "sizes": entry["sizes"], "graphs": entry.get("graphs", []),
            "compile_cache": "warm (the no-artifact row's)", "stdout": done.stdout.strip()}


def start_rows(folder: Path, device: str, tiny: bool, threads: int,
               save: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Rows 2-5 of the module's docstring, each start in a fresh process; ``save(doc)`` is
    called after each (a run stopped at its time limit keeps the rows it finished). A row that
    fails keeps its error and the run goes on."""
    from bench.startup.start_child import SIZES

    work = Path(tempfile.mkdtemp(prefix="ff-start-"))
    doc: dict[str, Any] = {"starts": {}}
    caches = work / "cache-cold"
    plan: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("no_artifact", lambda: {"page_cache": "warm", "compile_cache": "empty",
                                 "artifact": False,
                                 **run_child(folder, device, tiny, threads, caches)}),
        ("compile", lambda: compile_row(folder, SIZES["tiny" if tiny else "cuda"], caches)),
        ("artifact_warm", lambda: {"page_cache": "warm", "compile_cache": "empty",
                                   "artifact": True,
                                   **run_child(folder, device, tiny, threads, work / "c2")})]
    if not tiny:
        plan.append(("artifact_dropped", lambda: {
            "page_cache": "dropped" if drop_caches() else "warm (drop_caches refused)",
            "compile_cache": "empty", "artifact": True,
            **run_child(folder, device, tiny, threads, work / "c3")}))
    for name, run in plan:
        try:
            row = run()
        except (SystemExit, subprocess.SubprocessError, OSError, ValueError) as e:
            row = {"error": str(e)[-3000:]}
            print(f"{name}: failed: {row['error']}", flush=True)
        if name == "compile":
            doc["compile"] = row
        else:
            doc["starts"][name] = row
        save(doc)
    failed = [n for n, r in [("compile", doc["compile"]), *doc["starts"].items()] if "error" in r]
    if failed:
        raise SystemExit(f"rows failed: {', '.join(failed)}")
    return doc


def graphs_s(row: dict[str, Any]) -> float:
    """Seconds the decoder's graphs of a start took, their waits for the weights left out."""
    return sum(g["seconds"] - g.get("wait_s", 0.0) for tier in row["warmup"].values()
               for g in tier.get("graphs", {}).values())


def targets(doc: dict[str, Any]) -> dict[str, Any]:
    """The issue's four checks (and the read's two), each with its figures and whether it
    was met (None where this run has no figure: the CPU has no decoder graphs)."""
    starts, raw = doc["starts"], doc["raw_read"]
    warm = starts["artifact_warm"]
    out: dict[str, Any] = {
        "ready_artifact_warm_le_15s": {"ready_s": warm["ready_s"], "met": warm["ready_s"] <= 15},
        "graphs_from_artifact_le_4s": {"seconds": graphs_s(warm),
                                       "met": graphs_s(warm) <= 4 if graphs_s(warm) else None},
        "first_job_within_10pct_of_second": {
            "first_s": warm["first_job_s"], "second_s": warm["second_job_s"],
            "met": warm["first_job_s"] <= 1.1 * warm["second_job_s"]}}
    diffusers = next((r for r in doc["load_methods"]["rows"]
                      if r["method"] == "diffusers" and r["cache"] == "warm"), None)
    if diffusers is not None and diffusers.get("seconds"):
        out["weights_warm_le_diffusers"] = {
            "framefleet_s": warm["weights_to_device_s"], "diffusers_s": diffusers["seconds"],
            "met": warm["weights_to_device_s"] <= diffusers["seconds"]}
    dropped = starts.get("artifact_dropped")
    if dropped is not None and raw["dropped"]:
        out["ready_dropped_le_raw_plus_6s"] = {
            "ready_s": dropped["ready_s"], "raw_read_s": raw["seconds"],
            "met": dropped["ready_s"] <= raw["seconds"] + 6}
        disk = dropped.get("disk_to_device_s")
        out["read_dropped_within_10pct_of_raw"] = {
            "disk_to_device_s": disk, "raw_read_s": raw["seconds"],
            "met": disk <= 1.1 * raw["seconds"] if disk is not None else None}
    return out


def table(doc: dict[str, Any]) -> list[str]:
    """The rows as markdown lines."""
    raw, compiled = doc["raw_read"], doc["compile"]
    lines = ["| row | ready | critical path (adds up to ready) | beside it | compiled | "
             "first job | second job |", "|---|---|---|---|---|---|---|"]
    for name, row in doc["starts"].items():
        path, _, beside = row["ready_line"].partition(" (the critical path)")
        lines.append(
            f"| {name.replace('_', ' ')} (page cache {row['page_cache']}, compile cache "
            f"{row['compile_cache']}) | {row['ready_s']:.1f} s | {path.split(': ', 1)[-1]} | "
            f"{beside.removeprefix('; beside it: ') or '-'} | {row['compiled'] or '-'} | "
            f"{row['first_job_s']:.1f} s | {row['second_job_s']:.1f} s |")
    lines += ["", f"Raw read: {raw['files']} files, {raw['bytes'] / 1e9:.1f} GB in "
              f"{raw['seconds']:.1f} s ({raw['gb_per_s']:.2f} GB/s, {threads_said(doc)}, page "
              f"cache {'dropped' if raw['dropped'] else 'warm: drop_caches refused'}).", "",
              f"framefleet compile: `{compiled['command']}`: {compiled['seconds']:.1f} s "
              f"(compile cache {compiled['compile_cache']}); artifact {compiled['bytes']} "
              f"bytes, sizes {', '.join(compiled['sizes'])}, decoder graphs "
              f"{', '.join(compiled['graphs']) or 'none (CUDA only)'}.", "", "Targets:", ""]
    for name, check in doc["targets"].items():
        figures = ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                            for k, v in check.items() if k != "met")
        met = {True: "met", False: "NOT met", None: "no figure here"}[check["met"]]
        lines.append(f"- {name}: {met} ({figures})")
    return lines


def threads_said(doc: dict[str, Any]) -> str:
    return f"{doc.get('threads', '?')} parallel cat"
