"""Job series: every end and retry, the queue wait, held GPU time, stage timings, output and
cost, and what this worker's GPU costs per hour.

Metric names follow Prometheus conventions (base units, ``_total`` counters, ``_ratio`` 0..1).
"""

from __future__ import annotations

import threading

from prometheus_client import Counter, Gauge, Histogram

from producer.wire.spec import STAGE_NAMES, JobResult, Prices
from worker.labels import REASONS
from worker.metrics.gpu import GPU_BUSY
from worker.metrics.registry import WORKER_REGISTRY

#: How a job ends: the values of ``framefleet_jobs_total{status}``. A retry or requeue is no end
#: (the job runs again): it is counted in ``framefleet_job_retries_total{kind}``.
OUTCOMES = ("success", "failure", "cancelled")
RETRY_KINDS = ("retry", "requeue")
#: A run that lost its lease (``worker.concerns.fencing``): no end, but device time it held.
FENCED = "fenced"

_WAIT_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400)
_WALL_BUCKETS = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)
_STAGE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

JOBS = Counter(
    "framefleet_jobs_total",
    "Jobs that ended, by outcome (status: success|failure|cancelled), failure reason (an error"
    " class of producer.errors; empty unless status is failure) and tenant.",
    ["status", "reason", "tenant"],
    registry=WORKER_REGISTRY,
)
RETRIES = Counter(
    "framefleet_job_retries_total",
    "Runs that sent their job back to the queue: kind retry (a retryable error, spends the"
    " retry budget) or requeue (OOM fallback, spot preemption), by reason and tenant.",
    ["kind", "reason", "tenant"],
    registry=WORKER_REGISTRY,
)
QUEUE_WAIT = Histogram(
    "framefleet_queue_wait_seconds",
    "Seconds from submit (the client's enqueue stamp) to the start of a job's first delivery.",
    ["tenant"],
    buckets=_WAIT_BUCKETS,
    registry=WORKER_REGISTRY,
)
HELD = Counter(
    "framefleet_gpu_held_seconds_total",
    "Seconds a run held its worker's device, by how the run ended"
    " (success|failure|retry|requeue|cancelled) and tenant: failed runs were paid for too.",
    ["status", "tenant"],
    registry=WORKER_REGISTRY,
)
JOB_WALL = Histogram(
    "framefleet_job_wall_seconds",
    "Wall time of a successful job, from task start to result.",
    buckets=_WALL_BUCKETS,
    registry=WORKER_REGISTRY,
)
#: The ``tier`` and ``cache`` labels of a decode job's stages (and of no step cache).
NO_TIER = "none"
STAGE_SECONDS = Histogram(
    "framefleet_stage_seconds",
    "Seconds per pipeline stage and job (stages overlap in async mode); tier and cache: a "
    "generate job's speed settings (exact|fp8, none|first_block|taylorseer|mag), none for "
    "decode jobs.",
    ["stage", "tier", "cache"],
    buckets=_STAGE_BUCKETS,
    registry=WORKER_REGISTRY,
)
FRAMES = Counter("framefleet_frames_total", "Frames decoded and encoded.", registry=WORKER_REGISTRY)
PREVIEW_FAILURES = Counter("framefleet_preview_failures_total", "Previews not made or stored "
                           "(the job went on; the next preview tried again).",
                           registry=WORKER_REGISTRY)
OUTPUT_BYTES = Counter(
    "framefleet_output_bytes_total", "Bytes of MP4 segments uploaded.", registry=WORKER_REGISTRY
)
VIDEO_SECONDS = Counter(
    "framefleet_video_seconds_total",
    "Seconds of output video produced (divide cost by it for $ per video-minute).",
    registry=WORKER_REGISTRY,
)
COST = Counter(
    "framefleet_cost_usd_total",
    "Direct cost-to-serve of finished jobs (CostReport.total_usd).",
    ["tenant"],
    registry=WORKER_REGISTRY,
)
GPU_PRICE = Gauge(
    "framefleet_gpu_cost_usd_per_hour",
    "What this worker's GPU costs per hour held, busy or idle (instance $/h / GPUs).",
    ["instance_type", "capacity"],
    registry=WORKER_REGISTRY,
)

for _stage in STAGE_NAMES:  # every stage series exists from the start, so dashboards show zeros
    STAGE_SECONDS.labels(stage=_stage, tier=NO_TIER, cache=NO_TIER)

_price_lock = threading.Lock()
_price_labels: tuple[str, str] | None = None


def set_gpu_price(prices: Prices) -> None:
    """Publish what this worker's GPU costs per hour (call at start; jobs refresh it)."""
    global _price_labels
    labels = (prices.instance_type, prices.capacity)
    with _price_lock:
        if _price_labels not in (None, labels):
            GPU_PRICE.clear()  # one series per worker, even after its prices changed
        _price_labels = labels
        GPU_PRICE.labels(*labels).set(prices.instance_usd_per_hour / prices.gpus_per_instance)


def observe_job(status: str, tenant: str, result: JobResult | None, *, reason: str = "") -> None:
    """Count one ended job (``tenant`` is the label: see ``worker.labels``); with a result,
    record its timings, output and cost.

    ``reason`` (a value of :data:`REASONS`) is given for failures only. A result whose output
    was ``reused`` did no work now: it is counted, but its (near zero) timings would skew the
    latency histograms, so they and its frames are left out.
    """
    if status not in OUTCOMES:
        raise ValueError(
            f"status must be one of {OUTCOMES}, got {status!r} (retries: observe_retry)"
        )
    if (status == "failure") != bool(reason) or (reason and reason not in REASONS):
        raise ValueError(f"reason {reason!r}: a failure needs one of REASONS, others none")
    JOBS.labels(status=status, reason=reason, tenant=tenant).inc()
    if result is None:
        return
    if not result.reused:
        timings = result.timings
        JOB_WALL.observe(timings.wall_s)
        facts = result.manifest.generate
        tier, cache = (facts.tier, facts.cache) if facts is not None else (NO_TIER, NO_TIER)
        for stage in STAGE_NAMES:
            STAGE_SECONDS.labels(stage=stage, tier=tier, cache=cache).observe(
                getattr(timings, f"{stage}_s"))
        output = result.manifest
        FRAMES.inc(output.frames)
        OUTPUT_BYTES.inc(sum(segment.bytes for segment in output.segments))
        VIDEO_SECONDS.inc(output.video_seconds)
        if timings.gpu_busy_ratio is not None:
            GPU_BUSY.labels(device=result.worker.device).set(timings.gpu_busy_ratio)
    if result.cost is not None:
        COST.labels(tenant=tenant).inc(result.cost.total_usd)
        set_gpu_price(result.cost.prices)


def observe_retry(kind: str, tenant: str, reason: str) -> None:
    """Count one run that sent its job back to the queue (``kind``: retry or requeue)."""
    if kind not in RETRY_KINDS or reason not in REASONS:
        raise ValueError(f"kind must be one of {RETRY_KINDS} and reason one of REASONS, "
                         f"got {kind!r}, {reason!r}")
    RETRIES.labels(kind=kind, reason=reason, tenant=tenant).inc()


def observe_queue_wait(tenant: str, seconds: float) -> None:
    """Record how long a job waited in the queue before its first delivery started."""
    QUEUE_WAIT.labels(tenant=tenant).observe(max(0.0, seconds))


def observe_held(status: str, tenant: str, seconds: float) -> None:
    """Add the seconds one run held its device, whatever its end (``status``)."""
    if status not in (*OUTCOMES, *RETRY_KINDS, FENCED):
        raise ValueError(f"status must be one of {(*OUTCOMES, *RETRY_KINDS, FENCED)}, got "
                         f"{status!r}")
    HELD.labels(status=status, tenant=tenant).inc(max(0.0, seconds))
