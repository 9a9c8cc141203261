"""Which device decodes, and what the job result says about it.

Nothing here touches CUDA at import. A worker initialises CUDA only in the process that runs
tasks, after any fork: a CUDA context does not survive ``fork()``, and Celery's prefork pool
forks its children after the main process has started.
"""

from __future__ import annotations

import os
import socket

import torch

from producer.errors import DeviceOutOfMemory, FatalJobError
from producer.wire.spec import WorkerInfo


def resolve_device(requested: str) -> torch.device:
    if requested == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda", 0)  # CUDA_VISIBLE_DEVICES pins one GPU per worker
    if requested == "cuda":
        raise FatalJobError("FRAMEFLEET_DEVICE=cuda but no CUDA device is visible")
    return torch.device("cpu")


def out_of_memory(e: torch.OutOfMemoryError, what: str) -> DeviceOutOfMemory:
    """The retryable error for a CUDA out-of-memory while doing ``what``, after handing the
    failed attempt's cached blocks back to the driver (the retry needs them)."""
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    return DeviceOutOfMemory(f"CUDA out of memory {what}: {e}")


def nonfinite(tensor: torch.Tensor) -> int:
    """How many values of ``tensor`` are NaN or infinite (one reduction, then a sync)."""
    return int(torch.isfinite(tensor).logical_not_().sum())


def worker_info(device: torch.device, node: str | None = None) -> WorkerInfo:
    name = uuid = None
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        try:
            uuid = str(torch.cuda.get_device_properties(device).uuid)
        except (AttributeError, RuntimeError):
            uuid = None
    host = socket.gethostname()
    return WorkerInfo(
        hostname=host, node=node or f"{os.getpid()}@{host}", pid=os.getpid(),
        device=str(device), gpu_name=name, gpu_uuid=uuid,
    )
