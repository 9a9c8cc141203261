"""Start and compile series: readiness, where the start's seconds went, what the compile
artifacts served (per warm-up size of the transformer, per decoder graph), and the broker's
persistence as seen at the start."""

from __future__ import annotations

from typing import Any

from prometheus_client import Gauge

from worker.metrics.registry import WORKER_REGISTRY

WORKER_READY = Gauge(
    "framefleet_worker_ready",
    "1 once this worker's warm-up decode sizes are compiled and captured; 0 while warming up.",
    registry=WORKER_REGISTRY,
)
WORKER_START = Gauge("framefleet_worker_start_seconds", "Process start to ready, by phase: "
                     "each step's own seconds; steps that ran beside each other overlap "
                     "(worker.lifecycle.startphases).", ["phase"], registry=WORKER_REGISTRY)
WORKER_START_CRITICAL = Gauge(
    "framefleet_worker_start_critical_seconds",
    "Process start to ready, by phase: the seconds the start waited on each step (its share "
    "of the critical path; the phases add up to the total).", ["phase"],
    registry=WORKER_REGISTRY)
BROKER_PERSISTENT = Gauge(
    "framefleet_broker_persistent",
    "Broker persistence seen at worker start: 1 append-only file, 0.5 RDB snapshots only, 0 "
    "none (a restart loses every queued job), -1 unknown (CONFIG refused, as on managed Redis).",
    registry=WORKER_REGISTRY,
)

#: The reasons a miss may give (bounded: they are label values).
REASONS = ("none", "config", "tier", "torch", "triton", "device", "size", "graph", "cache",
           "error")

COMPILED_SIZE = Gauge(
    "framefleet_worker_compiled_size",
    "Warm-up sizes of this worker process, 1 per (tier, size): result hit (served from a "
    "compile artifact, no compile: inductor's FX graph cache hit) or miss, and why a miss "
    "missed (none: no artifact; config, tier, torch, triton, device: the artifact's differs; "
    "size: the artifact does not cover it; cache: covered, yet the FX graph cache missed).",
    ["tier", "size", "result", "reason"], registry=WORKER_REGISTRY)
DECODE_GRAPH = Gauge(
    "framefleet_worker_decode_graph",
    "Decoder graphs of this worker's warm-up, 1 per (graph, latent): graph steady (every "
    "chunk after the first) or first (a job's first chunk), latent CxHxW; result hit (its "
    "compile served from the caches, nothing compiled) or miss, and why (as "
    "framefleet_worker_compiled_size; graph: the artifact does not cover this graph).",
    ["graph", "latent", "result", "reason"], registry=WORKER_REGISTRY)
ARTIFACT_LOAD = Gauge(
    "framefleet_worker_compile_artifact_load_seconds",
    "Seconds this worker process took to read, check and load its compile artifact, per tier.",
    ["tier"], registry=WORKER_REGISTRY)


def reason_code(reason: str) -> str:
    """The bounded label of a miss's reason text (``artifacts.Loaded.reason`` and the
    warm-up's own)."""
    if not reason:
        return ""
    word = reason.split()[0].rstrip(":")
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


def publish_graphs(graphs: dict[str, dict[str, Any]]) -> None:
    """Set the series of the decoder graphs (``graphs``: ``"steady 48x44x80"`` → {result,
    reason}, as ``worker.generate.model.warm`` names them)."""
    for name, outcome in graphs.items():
        kind, _, latent = name.partition(" ")
        DECODE_GRAPH.labels(kind, latent, outcome["result"],
                            reason_code(outcome.get("reason", ""))).set(1)


def publish_start(phases: dict[str, float], critical: dict[str, float]) -> None:
    """Set the start's series: each step's own seconds, and its share of the critical path."""
    for phase, seconds in phases.items():
        WORKER_START.labels(phase).set(seconds)
    for phase, seconds in critical.items():
        WORKER_START_CRITICAL.labels(phase).set(seconds)
