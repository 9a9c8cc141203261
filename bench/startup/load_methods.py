"""The ways of loading a model folder onto the device, each in a fresh process, timed and
checked bit for bit against diffusers' own loading.

Methods (``--methods``; names as in the results):

- ``diffusers``: ``<pipeline>.from_pretrained(folder, dtype=bfloat16)`` then ``.to(device)``;
- ``device_map``: ``from_pretrained(folder, dtype=bfloat16, device_map=device)`` (a pipeline
  takes ``"balanced"``, the current accelerator's name or ``"cpu"``; a refusal is recorded);
- ``fast:N``: the worker's fast path, ``worker.generate.model.fastload.load_pipeline`` in N
  threads (``--threads-list``);
- ``fastsafetensors``: the same fast path with each shard read by ``fastsafetensors``
  (``fastsafe_open``, no GPUDirect Storage) instead of ``safetensors``' ``safe_open``; recorded
  as not installed where the package is not importable.

Each row: seconds from the call to the models on the device (read, cast, moved, the device
synchronized; imports and the device's own start before it, outside), the child's peak host
RSS over that span (``VmHWM`` of ``/proc/self/status``, reset by ``/proc/self/clear_refs``
once the imports are done, where the kernel allows: recorded), and a digest of every
parameter and buffer of every model component (sha256 over name, dtype, shape and bytes,
read back to the host after the clock stopped). ``exact``: the digest equals the diffusers
row's. :func:`choose` takes the fastest exact row, cold where the page cache was dropped.

A child run, as the benchmark starts it::

    python bench/startup/load_methods.py --child fast:8 --folder F --device cuda
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

THREADS = (1, 4, 8, 16)
METHODS = ("diffusers", "device_map", "fast", "fastsafetensors")


def parse_methods(spec: str, threads: list[int]) -> list[str]:
    """``all`` or a comma list of :data:`METHODS` (``fast`` stands for ``fast:N`` for each
    of ``threads``; ``fast:N`` names one) → the methods in run order."""
    names = list(METHODS) if spec.strip() in ("", "all") else [
        s.strip() for s in spec.split(",") if s.strip()]
    out: list[str] = []
    for name in names:
        if name == "fast":
            out += [f"fast:{n}" for n in threads]
        elif name in METHODS or (name.startswith("fast:") and name[5:].isdigit()):
            out.append(name)
        else:
            raise SystemExit(f"--methods: unknown method {name!r} (known: {', '.join(METHODS)}, "
                             "fast:N)")
    return list(dict.fromkeys(out))


def drop_caches() -> bool:
    """Empty the page cache where this process may (root, a writable /proc/sys)."""
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _reset_peak() -> bool:
    """Reset ``VmHWM`` to the current RSS (Linux >= 4.0), so the peak is the load's."""
    try:
        Path("/proc/self/clear_refs").write_text("5\n")
        return True
    except OSError:
        return False


def digest(pipe: Any) -> dict[str, Any]:
    """sha256 over every parameter and buffer of every ``torch.nn.Module`` component, in name
    order: each tensor's bytes hashed on its own (in threads: hashlib lets go of the GIL),
    then name, dtype, shape and that hash hashed together. Also counts the tensors and those
    not on the device the first one is on."""
    import torch

    items: list[tuple[str, torch.Tensor]] = []
    for comp, module in sorted(pipe.components.items()):
        if isinstance(module, torch.nn.Module):
            named = {**dict(module.named_parameters(remove_duplicate=False)),
                     **dict(module.named_buffers(remove_duplicate=False))}
            items += [(f"{comp}.{k}", t) for k, t in sorted(named.items())]

    def one(t: torch.Tensor) -> str:
        raw = t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        return hashlib.sha256(raw.numpy().data).hexdigest()  # a view: no copy to bytes

    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        hashes = list(pool.map(one, (t for _, t in items)))
    whole = hashlib.sha256()
    for (name, t), h in zip(items, hashes, strict=True):
        whole.update(f"{name}|{t.dtype}|{tuple(t.shape)}|{h}\n".encode())
    kinds = {t.device.type for _, t in items}
    return {"digest": whole.hexdigest(), "tensors": len(items), "devices": sorted(kinds)}


def _load(method: str, folder: str, pipeline: str, device: str) -> tuple[Any, dict[str, Any]]:
    """One method's load, on the clock of the caller; returns the pipeline and its extras."""
    import diffusers
    import torch

    from worker import quiet

    dtype = torch.bfloat16
    cls = getattr(diffusers, pipeline)
    extra: dict[str, Any] = {}
    if method == "diffusers":
        t = time.perf_counter()
        pipe = cls.from_pretrained(folder, **quiet.dtype_kwargs(dtype))
        extra["from_pretrained_s"] = time.perf_counter() - t
        t = time.perf_counter()
        pipe.to(device)
        _sync(device)
        extra["to_device_s"] = time.perf_counter() - t
        extra["weights_to_device_s"] = extra["from_pretrained_s"] + extra["to_device_s"]
        return pipe, extra
    if method == "device_map":
        return cls.from_pretrained(folder, **quiet.dtype_kwargs(dtype), device_map=device), extra
    from worker.generate.model import fastload

    if method == "fastsafetensors":
        import fastsafetensors

        extra["version"] = fastsafetensors.__version__
        fastload._read_shard = _fastsafetensors_reader(fastload)  # this process only
        threads = 1  # fastsafetensors reads a file in its own threads
    else:
        threads = int(method.split(":")[1])
    pipe, times = fastload.load_pipeline(Path(folder), pipeline, dtype, torch.device(device),
                                         threads)
    extra.update(build_s=times.build_s, read_s=times.read_s, cast_move_s=times.cast_move_s)
    return pipe, extra


def _fastsafetensors_reader(fastload: Any) -> Any:
    """``fastload._read_shard`` with the file read by ``fastsafetensors`` (the whole file to
    the device in its threads, the tensors views of that buffer), then cast the same way."""
    import torch
    from fastsafetensors import fastsafe_open

    from producer.errors import InvalidJobError

    def read(shard: Path, names: list[str], model: Any, library: str, dtype: Any,
             device: Any) -> tuple[dict[str, Any], int]:
        out, size = {}, 0
        if device.type == "cuda" and device.index is None:  # it sets the device by index
            device = torch.device("cuda", torch.cuda.current_device())
        # 0.5 documents that a tensor keeps its file buffer alive after the block: no clone
        with fastsafe_open([str(shard)], device=str(device), nogds=True) as f:
            present = set(f.keys())
            for key in names:
                if key not in present:
                    raise InvalidJobError(f"{fastload.FIELD}: {shard} has no tensor {key!r}")
                tensor = f.get_tensor(key)
                size += tensor.numel() * tensor.element_size()
                out[key] = tensor.to(fastload.target_dtype(model, library, key, tensor.dtype,
                                                           dtype))
        return out, size

    return read


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def child(method: str, folder: str, device: str, started: float) -> dict[str, Any]:
    """Runs in a fresh process: the imports and the device's start, then one load timed."""
    import diffusers
    import torch

    from worker import quiet

    quiet.progress_bars_off()
    index = json.loads((Path(folder) / "model_index.json").read_text())
    for value in index.values():  # every class imported before the clock (diffusers is lazy)
        if isinstance(value, list) and len(value) == 2 and value[0]:
            getattr(importlib.import_module(value[0]), value[1])
    pipeline = index["_class_name"]
    getattr(diffusers, pipeline)
    import accelerate  # noqa: F401  (both paths build empty models with it)

    from worker.generate.model import fastload  # noqa: F401

    torch.empty(1, device=device)  # the device's context, not the load's
    out: dict[str, Any] = {"method": method, "imports_s": time.time() - started,
                           "rss_base_bytes": _status_kb("VmRSS") * 1024}
    out["rss_reset"] = _reset_peak()
    t = time.perf_counter()
    pipe, extra = _load(method, folder, pipeline, device)
    _sync(device)
    out["seconds"] = time.perf_counter() - t
    out["rss_peak_bytes"] = _status_kb("VmHWM") * 1024
    out.update(extra)
    out.update(digest(pipe))
    out["on_device"] = out["devices"] == [torch.device(device).type]
    return out


def run_method(method: str, folder: Path, device: str, drop: bool) -> dict[str, Any]:
    """One method in a fresh process (the page cache dropped first if ``drop``). A method
    that cannot run here is a row that says so, not a failed benchmark."""
    row: dict[str, Any] = {"method": method}
    if method == "fastsafetensors" and importlib.util.find_spec("fastsafetensors") is None:
        return {**row, "status": "not installed"}
    if drop:
        row["dropped"] = drop_caches()
    started = time.time()
    cmd = [sys.executable, __file__, "--child", method, "--folder", str(folder), "--device",
           device, "--started", repr(started)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=3600)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {**row, "status": f"failed: {tail[:300]}"}
    return {**row, "status": "ok", **json.loads(lines[-1])}


def mark_exact(rows: list[dict[str, Any]]) -> None:
    """``exact`` on each row that ran: its digest is the diffusers row's (None without one)."""
    ref = next((r["digest"] for r in rows if r["method"] == "diffusers" and "digest" in r),
               None)
    for r in rows:
        if "digest" in r:
            r["exact"] = None if ref is None else r["digest"] == ref


def choose(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The fastest row that is bit-identical to diffusers and wholly on the device: of the
    runs after a dropped page cache where there are any (a worker's first start reads from
    disk), else of the warm ones; with the reason. A row not exact is never chosen."""
    fit = [r for r in rows if r.get("exact") is True and r.get("on_device") and "seconds" in r]
    cold = [r for r in fit if r.get("cache") == "cold" and r.get("dropped")]
    pool = cold or fit
    if not pool:
        why = "no row matches diffusers' digest" if any("digest" in r for r in rows) else \
            "no method ran"
        return {"method": None, "reason": why}
    ranked = sorted(pool, key=lambda r: r["seconds"])
    best = ranked[0]
    where = "page cache dropped" if pool is cold else "page cache warm"
    reason = (f"fastest of the exact methods, {where}: {best['seconds']:.2f} s, every tensor "
              "bit-identical to diffusers' from_pretrained")
    if len(ranked) > 1:
        nxt = ranked[1]
        reason += f"; next {nxt['method']} {nxt['seconds']:.2f} s"
    bad = sorted({r["method"] for r in rows if r.get("exact") is False})
    if bad:
        reason += f"; not exact, never chosen: {', '.join(bad)}"
    return {"method": best["method"], "cache": best.get("cache"), "seconds": best["seconds"],
            "reason": reason}


def compare(folder: Path, device: str, methods: list[str],
            caches: list[tuple[str, bool]]) -> dict[str, Any]:
    """Every method under every page-cache state, warm first; rows marked and chosen."""
    rows = []
    for cache, drop in caches:
        for method in methods:
            rows.append({"cache": cache, **run_method(method, folder, device, drop)})
            print(f"load {cache} {method}: {rows[-1]['status']} "
                  f"{rows[-1].get('seconds', 0.0):.2f} s", file=sys.stderr, flush=True)
    mark_exact(rows)
    return {"rows": rows, "chosen": choose(rows)}


def table(result: dict[str, Any]) -> str:
    """The load methods as markdown: a row per method and page cache, then the chosen one."""
    lines = ["## Load methods", "", "| page cache | method | seconds | peak host RSS | tensors | "
             "digest | exact | note |", "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        cache = r["cache"] + (" (not dropped)" if r["cache"] == "cold" and not r.get("dropped")
                              else "")
        if "seconds" not in r:
            lines.append(f"| {cache} | {r['method']} | | | | | | {r['status']} |")
            continue
        exact = {True: "yes", False: "**no**", None: "no reference"}[r.get("exact")]
        note = "" if r["on_device"] else f"tensors on {', '.join(r['devices'])}"
        lines.append(f"| {cache} | {r['method']} | {r['seconds']:.2f} s | "
                     f"{r['rss_peak_bytes'] / 2**30:.2f} GiB | {r['tensors']} | "
                     f"`{r['digest'][:12]}` | {exact} | {note} |")
    chosen = result["chosen"]
    lines += ["", f"chosen: {chosen['method'] or 'none'} ({chosen['reason']})"]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", required=True, help="the method to run in this process")
    ap.add_argument("--folder", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--started", type=float, default=0.0)
    args = ap.parse_args()
    print(json.dumps(child(args.child, args.folder, args.device, args.started or time.time())))


if __name__ == "__main__":
    main()
