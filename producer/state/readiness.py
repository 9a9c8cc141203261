"""Readiness files: each worker process writes one, ``framefleet healthcheck`` reads them.

A worker process writes ``{work_dir}/framefleet-ready/{pid}.json`` when it starts warming up
and again when it is ready (``worker.lifecycle.warmup``); the healthcheck, which runs in the
producer's package and never imports ``worker``, reads them. A process that died or was
replaced (its pid reused after a restart) is recognised by its start time and ignored.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from producer.settings import Settings

STATE_FOLDER = "framefleet-ready"


@dataclass
class WarmupState:
    """What one worker process says about itself (the JSON of its state file)."""

    pid: int
    start: str  # the process's start time (clock ticks since boot): tells a reused pid apart
    #: the Celery node it serves (``gpu0@host``): what Flower, logs and the cost report name
    node: str | None = None
    #: the broker it consumes, as ``producer.client.connection.address`` names it (no
    #: password): one host may run several fleets (``framefleet fleet`` shows one's)
    broker: str | None = None
    ready: bool = False
    decoder: str | None = None
    sizes: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    build_s: float = 0.0  # of ``seconds``: building (or loading) the warm-up decoder
    cache_dir: str | None = None
    #: FRAMEFLEET_WARMUP_MODEL per tier: load (and quantise) seconds, compile seconds per size
    model: dict[str, Any] = field(default_factory=dict)
    #: seconds of the start by phase, process start to ready (worker.lifecycle.startphases)
    phases: dict[str, float] = field(default_factory=dict)
    #: the same start's critical path by phase: adds up to phases["total"]
    critical: dict[str, float] = field(default_factory=dict)


def state_dir(settings: Settings) -> Path:
    return Path(settings.work_dir or tempfile.gettempdir()) / STATE_FOLDER


def process_start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat; "" where there is no /proc; None: no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        if Path("/proc/self/stat").exists():
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return ""
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def write_state(folder: Path, state: WarmupState) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{state.pid}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(state)))
    tmp.replace(path)  # atomic: the healthcheck never reads half a file


def live_states(folder: Path) -> list[WarmupState]:
    """States of the worker processes alive now (files of dead ones are removed)."""
    states = []
    for path in sorted(folder.glob("*.json")):
        try:
            state = WarmupState(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        if process_start_time(state.pid) != state.start:
            path.unlink(missing_ok=True)
            continue
        states.append(state)
    return states


def not_ready(settings: Settings) -> list[str]:
    """Why this host's workers are not ready (empty: every live worker process is ready)."""
    states = live_states(state_dir(settings))
    if not states:
        return ["no worker process on this host has started"]
    return [f"worker process {s.pid} still warming up {s.decoder or ''}".rstrip()
            for s in states if not s.ready]
