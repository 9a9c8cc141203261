"""GPU series: the last job's busy ratio, NVML utilisation and memory, torch's VRAM, sampled
by :class:`NvmlSampler` in the process that runs jobs."""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any

from prometheus_client import Gauge

from worker.metrics.registry import WORKER_REGISTRY

log = logging.getLogger(__name__)

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
