"""Prometheus series of a worker: jobs, stage timings, output, cost and GPU samples.

Worker series live in :data:`WORKER_REGISTRY` (served by :func:`start_metrics_server` in the
process that runs tasks: with Celery's prefork pool that is the pool child, so start it from
``worker_process_init``, where CUDA is initialised too). The fleet's queue depth is not a
worker's to report: :mod:`producer.ops.exporter` serves it, one per fleet.

Metric names follow Prometheus conventions (base units, ``_total`` counters, ``_ratio`` 0..1).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)

from producer.ops.exporter import EXPORTER_REGISTRY
from producer.settings import get_settings
from producer.wire.spec import STAGE_NAMES, JobResult, Prices
from worker.labels import REASONS

log = logging.getLogger(__name__)

#: How a job ends: the values of ``framefleet_jobs_total{status}``. A retry or requeue is no end
#: (the job runs again): it is counted in ``framefleet_job_retries_total{kind}``.
OUTCOMES = ("success", "failure", "cancelled")
RETRY_KINDS = ("retry", "requeue")

WORKER_REGISTRY = CollectorRegistry()
ProcessCollector(registry=WORKER_REGISTRY)
PlatformCollector(registry=WORKER_REGISTRY)

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
# Labelled so that the series is absent, not 0, until a first job (or price) sets it.
GPU_BUSY = Gauge(
    "framefleet_gpu_busy_ratio",
    "GPU busy ratio of the last job (decode time over the decode window).",
    ["device"],
    registry=WORKER_REGISTRY,
)
GPU_UTILIZATION = Gauge(
    "framefleet_gpu_utilization_ratio",
    "NVML GPU utilization (share of time a kernel ran), sampled.",
    ["gpu", "uuid"],
    registry=WORKER_REGISTRY,
)
GPU_MEMORY = Gauge(
    "framefleet_gpu_memory_used_bytes",
    "NVML device memory used, all processes.",
    ["gpu", "uuid"],
    registry=WORKER_REGISTRY,
)
TORCH_VRAM = Gauge(
    "framefleet_torch_vram_allocated_bytes",
    "torch.cuda.memory_allocated of this process.",
    ["device"],
    registry=WORKER_REGISTRY,
)
VRAM_AFTER_JOB = Gauge(
    "framefleet_torch_vram_after_job_bytes", "torch.cuda memory of this process when its last "
    "job ended: allocated (tensors) or reserved (caching allocator).", ["kind"],
    registry=WORKER_REGISTRY)
WORKER_READY = Gauge(
    "framefleet_worker_ready",
    "1 once this worker's warm-up decode sizes are compiled and captured; 0 while warming up.",
    registry=WORKER_REGISTRY,
)
WORKER_START = Gauge("framefleet_worker_start_seconds", "Process start to ready, by phase "
                     "(worker.lifecycle.startphases).", ["phase"], registry=WORKER_REGISTRY)
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
BROKER_PERSISTENT = Gauge(
    "framefleet_broker_persistent",
    "Broker persistence seen at worker start: 1 append-only file, 0.5 RDB snapshots only, 0 "
    "none (a restart loses every queued job), -1 unknown (CONFIG refused, as on managed Redis).",
    registry=WORKER_REGISTRY,
)

for _stage in STAGE_NAMES:  # every stage series exists from the start, so dashboards show zeros
    STAGE_SECONDS.labels(stage=_stage, tier=NO_TIER, cache=NO_TIER)

_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gauge": ("",),
}


def metric_names() -> frozenset[str]:
    """Every ``framefleet_*`` series name framefleet exposes, suffixes included: a worker's
    and the fleet exporter's (dashboards and alert rules use both)."""
    names: set[str] = set()
    for registry in (WORKER_REGISTRY, EXPORTER_REGISTRY):
        for family in registry.collect():
            if family.name.startswith("framefleet_"):
                names.update(family.name + s for s in _SUFFIXES.get(family.type, ("",)))
    return frozenset(names)


# --- worker -----------------------------------------------------------------------------------

_server_lock = threading.Lock()
_server: WSGIServer | None = None
_price_labels: tuple[str, str] | None = None


def start_metrics_server(port: int, addr: str | None = None) -> int:
    """Serve the worker's /metrics on ``addr:port``; 0 means off. Returns the port (0: off).

    ``addr`` defaults to FRAMEFLEET_METRICS_ADDR (loopback unless configured: the series are
    unauthenticated; the container images set 0.0.0.0 for Prometheus to scrape them).

    Idempotent within a process: a second call returns the port already served.
    """
    global _server
    if port == 0:
        return 0
    with _server_lock:
        if _server is None:
            addr = addr or str(get_settings().metrics_addr)
            _server, _thread = start_http_server(port, addr=addr, registry=WORKER_REGISTRY)
        return int(_server.server_port)


def stop_metrics_server() -> None:
    """Stop the server of :func:`start_metrics_server` (tests, clean shutdown)."""
    global _server
    with _server_lock:
        if _server is not None:
            _server.shutdown()
            _server.server_close()
            _server = None


def set_gpu_price(prices: Prices) -> None:
    """Publish what this worker's GPU costs per hour (call at start; jobs refresh it)."""
    global _price_labels
    labels = (prices.instance_type, prices.capacity)
    with _server_lock:
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
    if status not in (*OUTCOMES, *RETRY_KINDS):
        raise ValueError(f"status must be one of {(*OUTCOMES, *RETRY_KINDS)}, got {status!r}")
    HELD.labels(status=status, tenant=tenant).inc(max(0.0, seconds))


def _visible_devices() -> list[str] | None:
    """CUDA_VISIBLE_DEVICES entries (indices or GPU-/MIG- UUIDs); None when unset."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return [item.strip() for item in value.split(",") if item.strip()]


class NvmlSampler(threading.Thread):
    """Daemon thread sampling NVML utilization/memory and torch's VRAM every ``interval_s``.

    Samples the GPUs in ``devices`` (NVML indices or UUIDs; default: CUDA_VISIBLE_DEVICES, or
    all). NVML indices follow PCI bus order, so workers pinned by index should also set
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``. Without an NVIDIA driver (or nvidia-ml-py) the NVML
    series are simply absent. torch is read only if this process already imported it and
    initialised CUDA: importing it here would cost seconds and could initialise CUDA before a
    fork. Errors are logged (the first of each kind at WARNING) and sampling goes on.
    """

    def __init__(self, interval_s: float = 5.0, devices: Sequence[int | str] | None = None):
        super().__init__(name="framefleet-nvml-sampler", daemon=True)
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.interval_s = interval_s
        self._devices = None if devices is None else [str(d) for d in devices]
        self._stop_event = threading.Event()
        self._nvml: Any = None
        self._handles: list[tuple[str, str, Any]] | None = None
        self._errors_seen: set[str] = set()

    def run(self) -> None:
        try:
            while not self._stop_event.is_set():
                self.sample_once()
                self._stop_event.wait(self.interval_s)
        finally:
            self.close()

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the thread to stop and wait for it at most ``timeout`` seconds."""
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout)

    def sample_once(self) -> None:
        """Take one sample now (the thread calls this; tests may too)."""
        # Whatever goes wrong, a sampler must never take the worker down.
        try:
            self._sample_nvml()
        except Exception as e:  # noqa: BLE001
            self._log_error("NVML", e)
        try:
            self._sample_torch()
        except Exception as e:  # noqa: BLE001
            self._log_error("torch", e)

    @property
    def nvml_available(self) -> bool:
        return bool(self._handles)

    def close(self) -> None:
        if self._nvml is not None and self._handles is not None:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as e:
                self._log_error("NVML shutdown", e)
        self._handles = None

    def _open(self) -> list[tuple[str, str, Any]]:
        try:
            import pynvml
        except ImportError as e:  # nvidia-ml-py is in the [worker] extra only
            log.info("nvidia-ml-py missing, GPU utilization/memory series are off: %s", e)
            return []
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:  # no driver: NVMLError_LibraryNotFound / DriverNotLoaded
            log.info("NVML unavailable, GPU utilization/memory series are off: %s", e)
            return []
        self._nvml = pynvml
        wanted = self._devices if self._devices is not None else _visible_devices()
        if wanted is None:
            wanted = [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
        handles = []
        for item in wanted:
            if item.isdigit():
                handle = pynvml.nvmlDeviceGetHandleByIndex(int(item))
            else:
                handle = pynvml.nvmlDeviceGetHandleByUUID(item)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            handles.append((str(pynvml.nvmlDeviceGetIndex(handle)), str(uuid), handle))
        return handles

    def _sample_nvml(self) -> None:
        if self._handles is None:
            self._handles = self._open()
        for index, uuid, handle in self._handles:
            rates = self._nvml.nvmlDeviceGetUtilizationRates(handle)
            GPU_UTILIZATION.labels(gpu=index, uuid=uuid).set(rates.gpu / 100.0)
            memory = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            GPU_MEMORY.labels(gpu=index, uuid=uuid).set(memory.used)

    def _sample_torch(self) -> None:
        torch = sys.modules.get("torch")
        cuda = getattr(torch, "cuda", None)
        if cuda is None or not cuda.is_initialized():
            return
        for i in range(cuda.device_count()):
            TORCH_VRAM.labels(device=f"cuda:{i}").set(cuda.memory_allocated(i))

    def _log_error(self, what: str, error: Exception) -> None:
        key = f"{what}:{type(error).__name__}"
        level = logging.DEBUG if key in self._errors_seen else logging.WARNING
        self._errors_seen.add(key)
        log.log(level, "metrics sampler: %s failed: %s", what, error, exc_info=error)
