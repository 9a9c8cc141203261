"""The compile artifacts' series (``worker.generate.model.artifacts``): per warm-up size,
whether its compile was served from an artifact (a hit) or compiled, and why a miss missed.

Beside ``worker.metrics`` (whose registry it uses) so that module stays within its size."""

from __future__ import annotations

from typing import Any

from prometheus_client import Gauge

from worker.metrics import WORKER_REGISTRY

#: The reasons a miss may give (bounded: they are label values).
REASONS = ("none", "config", "tier", "torch", "triton", "device", "size", "cache", "error")

COMPILED_SIZE = Gauge(
    "framefleet_worker_compiled_size",
    "Warm-up sizes of this worker process, 1 per (tier, size): result hit (served from a "
    "compile artifact, no compile: inductor's FX graph cache hit) or miss, and why a miss "
    "missed (none: no artifact; config, tier, torch, triton, device: the artifact's differs; "
    "size: the artifact does not cover it; cache: covered, yet the FX graph cache missed).",
    ["tier", "size", "result", "reason"], registry=WORKER_REGISTRY)
ARTIFACT_LOAD = Gauge(
    "framefleet_worker_compile_artifact_load_seconds",
    "Seconds this worker process took to read, check and load its compile artifact, per tier.",
    ["tier"], registry=WORKER_REGISTRY)


def reason_code(reason: str) -> str:
    """The bounded label of a miss's reason text (``artifacts.Loaded.reason`` and the
    warm-up's own)."""
    if not reason:
        return ""
    word = reason.split()[0]
    if reason.startswith("model config"):
        return "config"
    if word in REASONS:
        return word
    return "none" if reason.startswith("no artifact") else "error"


def publish(tier: str, sizes: dict[str, dict[str, Any]], load_s: float) -> None:
    """Set the series for one tier's warm-up (``sizes``: size → {result, reason})."""
    ARTIFACT_LOAD.labels(tier).set(load_s)
    for size, outcome in sizes.items():
        COMPILED_SIZE.labels(tier, size, outcome["result"],
                             reason_code(outcome.get("reason", ""))).set(1)
