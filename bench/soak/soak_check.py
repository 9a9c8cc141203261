"""The soak's checks and report (``bench/soak/soak.py``): every output verified, the run judged."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import re
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from bench.report import device_name, write_json
from bench.soak.soak_plan import Item
from producer.wire.spec import JobResult

#: GPU memory may vary this much across the run's steady part (allocator rounding, caches).
MEMORY_SLACK_GIB = 2.0


def wait_denoising(handle: Any, timeout: float) -> None:
    """Until ``handle``'s job reports a denoise step (or has ended)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = handle.state()
        p = state.progress
        if state.finished or (p is not None and p.stage == "denoise" and p.steps_done >= 1):
            return
        time.sleep(0.05)


def cancel_in_denoise(client: Any, handle: Any, timeout: float) -> None:
    """Cancel ``handle``'s job once it is two steps into its denoise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        p = handle.progress()
        if p is not None and p.stage == "denoise" and p.steps_done >= 2:
            client.cancel(handle.key)
            return
        if handle.state().finished:
            return
        time.sleep(0.05)


def note_start(item: Item, state: Any, submitted: float) -> None:
    """The job's queue wait: from its submit to the first state past QUEUED."""
    if "queue_wait_s" not in item.meta and state.state not in ("PENDING", "QUEUED", "UNKNOWN"):
        item.meta["queue_wait_s"] = round(time.time() - submitted, 2)


def _segments_ok(result: JobResult, frames: int) -> tuple[bool, int, str]:
    import av

    total = 0
    for seg in result.manifest.segments:
        path = Path(seg.uri.removeprefix("file://"))
        try:
            with av.open(str(path)) as c:
                n = sum(1 for _ in c.decode(video=0))
        except Exception as e:  # noqa: BLE001 - any decode error is a bad output
            return False, total, f"{path.name}: {e}"
        if n != seg.frames:
            return False, total, f"{path.name}: {n} frames, manifest says {seg.frames}"
        total += n
    ok = total == result.manifest.frames and (not frames or total == frames)
    return ok, total, "" if ok else f"{total} frames decoded, expected {frames}"


def _latents_finite(result: JobResult) -> bool | None:
    uri = result.manifest.latents_uri
    if not uri:
        return None
    from safetensors.torch import load_file

    z = load_file(uri.removeprefix("file://"))["latents"]
    return bool(torch.isfinite(z).all())


def describe(result: JobResult, item: Item) -> dict[str, Any]:
    """What one successful job made and cost, and whether its output checks out."""
    ok, decoded, why = _segments_ok(result, item.frames)
    t = result.timings
    cost = result.cost
    return {
        "frames": result.manifest.frames, "decoded_frames": decoded, "output_ok": ok,
        "output_problem": why, "latents_finite": _latents_finite(result),
        "segments_sha256": [s.sha256 for s in result.manifest.segments],
        "latents_uri": result.manifest.latents_uri, "pid": result.worker.pid,
        "wall_s": t.wall_s, "denoise_s": t.denoise_s, "decode_s": t.decode_s,
        "text_encode_s": t.text_encode_s, "load_s": t.load_s,
        "gpu_seconds": cost.gpu_seconds if cost else None,
        "cost_usd": cost.total_usd if cost else None,
    }


def as_planned(expect: str, end: str) -> bool:
    if expect.startswith("failure:") and end.startswith("failure:"):
        return end.split(":", 1)[1] in expect.split(":", 1)[1].split("|")
    return expect == end


def scrape_memory(url: str) -> dict[str, float]:
    """torch's allocated and reserved GiB when the worker's last job ended."""
    try:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
    except OSError:
        return {}
    got = {}
    for kind in ("allocated", "reserved"):
        m = re.search(rf'^framefleet_torch_vram_after_job_bytes{{kind="{kind}"}} (\S+)$', text,
                      re.M)
        if m:
            got[f"{kind}_gib"] = round(float(m[1]) / 2**30, 3)
    return got


def _groups(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Jobs of one group from the second round on (the first of each size may decode while
    its graph builds): identical segments and identical latents bytes."""
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if r.get("group") and r["end"] == "success" and not r["job"].split(":")[-1].startswith(
                "r1-"):
            by[r["group"]].append(r)
    out = {}
    for group, rs in by.items():
        if len(rs) < 2:
            continue
        segs = {json.dumps(r["segments_sha256"]) for r in rs}
        lat = {_sha(r["latents_uri"]) for r in rs if r.get("latents_uri")}
        out[group] = {"jobs": [r["job"] for r in rs], "identical_segments": len(segs) == 1,
                      "identical_latents": len(lat) <= 1}
    return out


def _sha(uri: str) -> str:
    import hashlib

    return hashlib.sha256(Path(uri.removeprefix("file://")).read_bytes()).hexdigest()


def _memory(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Bound and growth of GPU memory after each job, over the run's second half."""
    alloc = [r["gpu_memory"].get("allocated_gib") for r in records if r.get("gpu_memory")]
    reserved = [r["gpu_memory"].get("reserved_gib") for r in records if r.get("gpu_memory")]
    alloc = [a for a in alloc if a is not None]
    reserved = [a for a in reserved if a is not None]
    if len(alloc) < 4:
        return {"measured": False, "flat": True}
    half = len(alloc) // 2
    growth = max(alloc[half:]) - max(alloc[:half])
    return {"measured": True, "allocated_max_gib": max(alloc),
            "reserved_max_gib": max(reserved) if reserved else None,
            "allocated_first_half_max_gib": max(alloc[:half]),
            "allocated_second_half_max_gib": max(alloc[half:]),
            "growth_gib": round(growth, 3), "bound_gib": round(max(alloc[:half]) +
                                                               MEMORY_SLACK_GIB, 3),
            "flat": growth <= MEMORY_SLACK_GIB}


def _deaths(records: list[dict[str, Any]], log: Path) -> dict[str, Any]:
    """Pool processes that changed, and whether a planned job explains each change."""
    text = log.read_text(errors="replace")
    lost = len(re.findall(r"Process 'ForkPoolWorker-\d+' pid:\d+ exited", text))
    planned = len(re.findall(r"exiting after exceeding memory limit|over the memory limit",
                             text))
    pids = [r["pid"] for r in records if r.get("pid")]
    changes = sum(1 for a, b in itertools.pairwise(pids) if a != b)
    memory_jobs = sum(1 for r in records if r["kind"] == "memory")
    return {"pool_pid_changes": changes, "lost_pool_processes_in_log": lost,
            "planned_replacements": memory_jobs, "memory_limit_lines": planned,
            "unplanned": max(0, changes - memory_jobs) + max(0, lost - memory_jobs)}


def report(records: list[dict[str, Any]], args: Any, ready_s: float,
           worker: subprocess.Popen[bytes], elapsed: float, log: Path) -> dict[str, Any]:
    cuda = torch.cuda.is_available() and not args.tiny
    device = device_name("cuda" if cuda else "cpu")
    bad_success = [r["job"] for r in records if r["end"] == "success"
                   and (r.get("latents_finite") is False or not r.get("output_ok", True))]
    groups = _groups(records)
    memory = _memory(records)
    deaths = _deaths(records, log)
    alive = worker.poll() is None
    doc = {
        "command": " ".join(["python", *sys.argv]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "device": device, "device_short": next(
            (g.lower() for g in ("H200", "H100") if g in device), "cpu" if not cuda else "gpu"),
        "torch": torch.__version__, "minutes": round(elapsed / 60, 2), "jobs": len(records),
        "worker_ready_s": round(ready_s, 1), "warm_sizes": getattr(args, "warm_sizes", "all"),
        "worker_alive_at_end": alive,
        "not_as_planned": [r["job"] for r in records if not r["as_planned"]],
        "nonfinite_or_bad_output_reported_as_success": bad_success,
        "groups": groups, "memory": memory, "deaths": deaths, "records": records,
    }
    doc["passed"] = bool(
        alive and not doc["not_as_planned"] and not bad_success and memory["flat"]
        and deaths["unplanned"] == 0 and all(g["identical_segments"] and g["identical_latents"]
                                             for g in groups.values())
        and len(records) >= args.jobs)
    return doc


def compiled(log: Path, args: Any, ready_s: float) -> dict[str, Any]:
    """What the worker's start compiled or took from the artifacts (its ``soak: compiled``
    lines: per model, tier, size and decoder graph, hit or miss), and whether it was ready
    within 30 s."""
    lines = re.findall(r"soak: compiled (\S+) (\S+) (graph \S+|\S+) (hit|miss) in ([0-9.]+) s",
                       log.read_text(errors="replace"))
    return {"artifacts": getattr(args, "artifacts", None),
            "compiled": [{"model": m, "tier": t, "what": w, "result": r, "seconds": float(s)}
                         for m, t, w, r, s in lines],
            "ready_within_30s": ready_s <= 30.0}


def table(doc: dict[str, Any]) -> str:
    head = ("| job | kind | end | queue wait s | wall s | denoise s | decode s | GPU-s | "
            "cost $ | GPU alloc / reserved GiB | output |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in doc["records"]:
        mem = r.get("gpu_memory") or {}
        fmt = lambda v, f=".2f": "-" if v is None else format(v, f)  # noqa: E731
        lines.append(
            f"| {r['job']} | {r['kind']} | {r['end']} | {fmt(r.get('queue_wait_s'))} | "
            f"{fmt(r.get('wall_s'))} | {fmt(r.get('denoise_s'))} | {fmt(r.get('decode_s'))} | "
            f"{fmt(r.get('gpu_seconds'))} | {fmt(r.get('cost_usd'), '.5f')} | "
            f"{fmt(mem.get('allocated_gib'))} / {fmt(mem.get('reserved_gib'))} | "
            f"{'ok' if r.get('output_ok', r['as_planned']) else 'BAD'} |")
    return "\n".join(lines)


def write(doc: dict[str, Any], path: Path) -> None:
    write_json(path, doc)
    summary = {k: doc[k] for k in ("device", "minutes", "jobs", "worker_ready_s", "warm_sizes",
                                   "artifacts", "compiled", "ready_within_30s",
                                   "worker_alive_at_end", "not_as_planned",
                                   "nonfinite_or_bad_output_reported_as_success", "memory",
                                   "deaths", "passed") if k in doc}
    md = [f"# GPU soak: {doc['device']}", "", f"`{doc['command']}`, {doc['date']}, torch "
          f"{doc['torch']}.", "", "```json", json.dumps(summary, indent=2), "```", "",
          "Groups (same seed, tier and inputs; second round on):", "",
          *(f"- {g}: {v['jobs']}: segments identical {v['identical_segments']}, latents "
            f"identical {v['identical_latents']}" for g, v in doc["groups"].items()), "",
          table(doc), ""]
    path.with_suffix(".md").write_text("\n".join(md))
    print(table(doc))
    print(json.dumps(summary, indent=2))
