"""Prometheus series of a worker, one module per family:

- ``registry``: :data:`WORKER_REGISTRY`, the /metrics server, :func:`metric_names`;
- ``jobs``: job ends and retries, queue wait, held GPU time, stage timings, output, cost;
- ``gpu``: the GPU busy ratio, NVML and torch VRAM samples (:class:`NvmlSampler`);
- ``start``: readiness, the start's phases and critical path, what the compile artifacts
  served (transformer sizes, decoder graphs), broker persistence;
- ``stuck``: runs taken for hung.

Every name of the families is re-exported here: callers write ``from worker import metrics``
and ``metrics.observe_job(...)``, whichever module holds it. These modules are the worker's
only users of prometheus_client.
"""

from __future__ import annotations

from typing import Any

from worker.metrics import registry
from worker.metrics.gpu import (
    GPU_BUSY,
    GPU_MEMORY,
    GPU_UTILIZATION,
    TORCH_VRAM,
    VRAM_AFTER_JOB,
    NvmlSampler,
)
from worker.metrics.jobs import (
    COST,
    FRAMES,
    GPU_PRICE,
    HELD,
    JOB_WALL,
    JOBS,
    NO_TIER,
    OUTCOMES,
    OUTPUT_BYTES,
    PREVIEW_FAILURES,
    QUEUE_WAIT,
    RETRIES,
    RETRY_KINDS,
    STAGE_SECONDS,
    VIDEO_SECONDS,
    observe_held,
    observe_job,
    observe_queue_wait,
    observe_retry,
    set_gpu_price,
)
from worker.metrics.registry import (
    WORKER_REGISTRY,
    metric_names,
    start_metrics_server,
    stop_metrics_server,
)
from worker.metrics.start import (
    ARTIFACT_LOAD,
    BROKER_PERSISTENT,
    COMPILED_SIZE,
    DECODE_GRAPH,
    WORKER_READY,
    WORKER_START,
    WORKER_START_CRITICAL,
    publish_start,
)
from worker.metrics.stuck import STUCK, observe_stuck

__all__ = [
    "ARTIFACT_LOAD", "BROKER_PERSISTENT", "COMPILED_SIZE", "COST", "DECODE_GRAPH", "FRAMES",
    "GPU_BUSY", "GPU_MEMORY", "GPU_PRICE", "GPU_UTILIZATION", "HELD", "JOBS", "JOB_WALL",
    "NO_TIER", "OUTCOMES", "OUTPUT_BYTES", "PREVIEW_FAILURES", "QUEUE_WAIT", "RETRIES",
    "RETRY_KINDS", "STAGE_SECONDS", "STUCK", "TORCH_VRAM", "VIDEO_SECONDS", "VRAM_AFTER_JOB",
    "WORKER_READY", "WORKER_REGISTRY", "WORKER_START", "WORKER_START_CRITICAL", "NvmlSampler",
    "metric_names", "observe_held", "observe_job", "observe_queue_wait", "observe_retry",
    "observe_stuck", "publish_start", "set_gpu_price", "start_metrics_server",
    "stop_metrics_server",
]


def __getattr__(name: str) -> Any:
    """``metrics._server``: the server running now (it is rebound on each start and stop, so
    it is read from its module at each access, never copied here)."""
    if name == "_server":
        return registry.server()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
