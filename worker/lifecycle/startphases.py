"""Where a worker's start went: process start → ready, by phase.

The phases (seconds, wall clock) are those of the pool process that runs jobs. A first pool
process counts from the start of the worker's main process (the Celery process the launcher
started; the pool process is forked from it, and the worker's start is what its phases tell).
A pool process forked later, to replace one that died (or had run its tasks), counts from its
own fork: it inherits an already-imported parent, and the parent's age is none of its start.

- ``imports``: from the main process's start to the pool process's start hook (Python,
  torch, diffusers and Celery imports, Celery's boot, the fork); a replacement's: its fork to
  its start hook, about 0;
- ``init``: the device and the decoder cache, the /metrics server;
- ``read``: the warm-up model's weights read (fast path: straight to the device, cast there);
- ``cast_move``: what its load did after the read (moving, tying, the text encoder's place);
- ``prepare``: quantising and wrapping its transformers for compile (fp8 tier);
- ``artifacts``: its compile artifacts read, checked and loaded
  (``worker.generate.model.artifacts``);
- ``compile_cache``: one denoise step per warm-up size, compiled from
  ``FRAMEFLEET_COMPILE_CACHE_DIR`` (a warm cache: no compile);
- ``model_decode``: (CUDA) the warm-up model's own decoder compiled and captured at each
  warm-up size's latent size;
- ``warmup``: the warm-up decoder built and captured at its sizes;
- ``builds``: (CUDA) the builds those queued, run once the warm-up let go of the device (the
  first-chunk decode graphs), waited for so that a first job does not wait for them;
- ``other``: what none of the above holds (a benchmark's own models built before the
  warm-up, the start's bookkeeping), so that the phases add up to the total;
- ``total``: process start to ready.

They are written to the readiness state (``framefleet fleet`` shows them) and to
``framefleet_worker_start_seconds{phase}`` before the worker reports ready.

No torch at import time: the healthcheck imports ``worker.lifecycle.warmup``.
"""

from __future__ import annotations

import os
import time
from typing import Any

PHASES = ("imports", "init", "read", "cast_move", "prepare", "artifacts", "compile_cache",
          "model_decode", "warmup", "builds", "other", "total")


def started_at(pid: int) -> float | None:
    """When process ``pid`` started (epoch seconds, to the clock tick); None where it cannot be
    told.

    /proc gives the start in ticks since boot. It is turned into an age against the boot clock
    now, and the age taken from the wall clock now: /proc/stat's ``btime`` is whole seconds (and
    drifts from the wall clock as NTP slews it), which would put a process forked a moment ago
    up to a second before its parent's own reading of the time."""
    try:
        ticks = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None
    age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - max(0.0, age)


#: Set in the main process once its first pool processes are up (``worker_ready``, which
#: Celery sends after it has started its pool): a pool process forked later inherits True, and
#: so knows it replaces one rather than being part of the worker's start.
_pool_up = False


def pool_up() -> None:
    """In the main process, once its first pool processes are started: the processes forked
    from now on replace others, and count their start from their own fork."""
    global _pool_up
    _pool_up = True


def main_started_at() -> float:
    """Where this process's start phases count from: the start of the worker's main process
    for one of its first pool processes (Celery's prefork pool: the parent), this process's
    own start for a replacement forked after the worker was up, or where there is no pool
    (solo pool, tests)."""
    own = started_at(os.getpid())
    if not _pool_up:
        parent = started_at(os.getppid())
        if parent is not None and own is not None and own - parent < 3600:
            return parent
    return own if own is not None else time.time()


def model_phases(model: dict[str, Any]) -> dict[str, float]:
    """``read``, ``cast_move``, ``prepare``, ``artifacts``, ``compile_cache`` and
    ``model_decode`` summed over the warm-up model's tiers
    (``worker.generate.model.warm.describe``)."""
    out = {"read": 0.0, "cast_move": 0.0, "prepare": 0.0, "artifacts": 0.0, "compile_cache": 0.0,
           "model_decode": 0.0}
    for tier in model.values():
        if not isinstance(tier, dict):
            continue
        out["read"] += float(tier.get("read_s", 0.0))
        out["cast_move"] += float(tier.get("cast_move_s", 0.0))
        out["prepare"] += float(tier.get("prepare_s", 0.0))
        artifact = tier.get("artifact")
        if isinstance(artifact, dict):
            out["artifacts"] += float(artifact.get("load_s", 0.0))
        out["compile_cache"] += sum(float(s) for s in tier.get("sizes", {}).values())
        out["model_decode"] += sum(float(s) for s in tier.get("decode", {}).values())
    return out


def other(phases: dict[str, float]) -> float:
    """Seconds of ``phases["total"]`` that no named phase holds (never below 0)."""
    named = sum(v for k, v in phases.items() if k not in ("total", "other"))
    return max(0.0, phases.get("total", 0.0) - named)


def compiled(model: dict[str, Any]) -> str:
    """The warm-up model's sizes, hit or miss and why, per tier, for the ready line:
    ``exact 480x832x81 hit, exact 704x1280x121 miss (torch 2.11.0 in the artifact, …)``."""
    parts = []
    for tier, info in model.items():
        if not isinstance(info, dict):
            continue
        for size, outcome in (info.get("cache") or {}).items():
            why = outcome.get("reason")
            parts.append(f"{tier} {size} {outcome.get('result')}" + (f" ({why})" if why else ""))
    return ", ".join(parts)
