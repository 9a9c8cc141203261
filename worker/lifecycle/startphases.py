"""Where a worker's start went: process start → ready, by phase, and its critical path.

The phases (seconds, wall clock) are those of the pool process that runs jobs. A first pool
process counts from the start of the worker's main process (the Celery process the launcher
started; the pool process is forked from it, and the worker's start is what its phases tell).
A pool process forked later, to replace one that died (or had run its tasks), counts from its
own fork: it inherits an already-imported parent, and the parent's age is none of its start.

- ``imports``: from the main process's start to the pool process's start hook (Python,
  torch, diffusers and Celery imports, Celery's boot, the fork); a replacement's: its fork to
  its start hook, about 0; then the warm-up model's classes (diffusers imports them on first
  use), while a thread makes the device's context;
- ``readahead``: the warm-up model's weight files read into the page cache from the main
  process's first moments, beside the imports (``worker.lifecycle.readahead``);
- ``init``: the device and the decoder cache, the /metrics server;
- ``artifacts``: the warm-up model's compile artifacts read, checked and loaded, every tier's
  before anything compiles (``worker.generate.model.artifacts``);
- ``read``: the warm-up model's weights read (fast path: straight to the device, cast there;
  the tokenizer and the scheduler beside);
- ``model_decode``: (CUDA) the warm-up model's decoder graphs (steady chunk and first chunk)
  at each warm-up size's latent size, built beside the read once the VAE is in; the seconds
  their captures waited for the last weights are the read's, not theirs;
- ``cast_move``: what its load did after the read (the pipeline built, moved, placed);
- ``prepare``: quantising and wrapping its transformers for compile (fp8 tier);
- ``compile_cache``: one denoise step per warm-up size, compiled from the artifacts and
  ``FRAMEFLEET_COMPILE_CACHE_DIR`` (a warm cache: no compile), and one prompt encoded (a first
  job's text encoder then pays no first call);
- ``warmup``: the warm-up decoder built and captured at its sizes;
- ``builds``: (CUDA) builds the warm-up queued, run once it let go of the device, waited for
  so that a first job does not wait for them;
- ``other``: what no step held (a benchmark's own models built before the warm-up, the
  start's bookkeeping);
- ``total``: process start to ready.

Steps overlap, so each phase's own seconds do not add up to the total. The critical path
does: each second of the start is charged to the step that, of those running then, ended
last (the one the start was waiting for), or to ``other`` when none ran. The readiness state
keeps both (``phases``: each step's own seconds, ``critical``: the path's, adding up to
``total``), and so do ``framefleet_worker_start_seconds{phase}`` and
``framefleet_worker_start_critical_seconds{phase}``, set before the worker reports ready.

No torch at import time: the healthcheck imports ``worker.lifecycle.warmup``.
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Any

PHASES = ("imports", "readahead", "init", "artifacts", "read", "model_decode", "cast_move",
          "prepare", "compile_cache", "warmup", "builds", "other", "total")
#: (phase, start, end): epoch seconds
Span = tuple[str, float, float]


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


def model_spans(model: dict[str, Any]) -> list[Span]:
    """The warm-up model's spans, every tier's (``worker.generate.model.warm.describe``)."""
    spans: list[Span] = []
    for tier in model.values():
        if isinstance(tier, dict):
            spans += [(str(p), float(a), float(b)) for p, a, b in tier.get("spans", [])]
    return spans


def own(spans: list[Span]) -> dict[str, float]:
    """Each phase's own seconds (its spans summed), every phase of :data:`PHASES` listed."""
    out = dict.fromkeys(PHASES[:-2], 0.0)
    for phase, a, b in spans:
        out[phase] = out.get(phase, 0.0) + max(0.0, b - a)
    return out


def critical(spans: list[Span], start: float, end: float) -> dict[str, float]:
    """``[start, end]`` charged to the phases: each moment to the span running then that ends
    last, to ``other`` where none runs. Adds up to ``end - start``."""
    cuts = sorted({start, end, *(min(max(t, start), end) for _, a, b in spans for t in (a, b))})
    out: dict[str, float] = {}
    for a, b in itertools.pairwise(cuts):
        running = [s for s in spans if s[1] <= a and s[2] >= b and s[2] > s[1]]
        phase = max(running, key=lambda s: s[2])[0] if running else "other"
        out[phase] = out.get(phase, 0.0) + (b - a)
    return out


def other(phases: dict[str, float]) -> float:
    """Seconds of ``phases["total"]`` that no named phase holds (never below 0)."""
    named = sum(v for k, v in phases.items() if k not in ("total", "other"))
    return max(0.0, phases.get("total", 0.0) - named)


def ready_line(phases: dict[str, float], path: dict[str, float]) -> str:
    """``14.2 s after its start: imports 2.1 s, read 8.9 s, … (the critical path); beside
    it: model_decode (3.5 s), …``: the path's phases in order (they add up to the total),
    then each step's seconds that ran beside it."""
    order = [p for p in PHASES if p != "total"]
    on = ", ".join(f"{p} {path[p]:.1f} s" for p in order if path.get(p, 0.0) >= 0.05)
    off = ", ".join(f"{p} ({phases[p] - path.get(p, 0.0):.1f} s)" for p in order
                    if p != "other" and phases.get(p, 0.0) - path.get(p, 0.0) >= 0.05)
    return (f"{phases.get('total', 0.0):.1f} s after its start: {on or 'none'} (the critical "
            "path)" + (f"; beside it: {off}" if off else ""))


def compiled(model: dict[str, Any]) -> str:
    """The warm-up model's sizes and decoder graphs, hit or miss and why, per tier, for the
    ready line: ``exact 480x832x81 hit, exact 704x1280x121 miss (torch 2.11.0 in the
    artifact, …), exact graph steady 48x44x80 hit, exact graph first 48x44x80 hit``."""
    parts = []
    for tier, info in model.items():
        if not isinstance(info, dict):
            continue
        for kind, outcomes in (("", info.get("cache")), ("graph ", info.get("graphs"))):
            for name, outcome in (outcomes or {}).items():
                why = outcome.get("reason")
                parts.append(f"{tier} {kind}{name} {outcome.get('result')}"
                             + (f" ({why})" if why else ""))
    return ", ".join(parts)
