"""The NVML sampler of a worker's metrics: GPU series when a driver answers, none otherwise."""

from __future__ import annotations

import sys
import time
import types

import pytest

from tests.worker.test_metrics import scrape, value
from worker import metrics


def _nvml_works() -> bool:
    try:
        import pynvml
    except ImportError:
        return False
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except pynvml.NVMLError:
        return False


def test_sampler_thread_stops_promptly_and_reads_torch_only_if_initialised(
    monkeypatch: pytest.MonkeyPatch, metrics_port: int
) -> None:
    # Given a torch module that this process "already imported" with CUDA initialised
    # (a stand-in: the sampler must never import torch itself).
    initialised = False
    cuda = types.SimpleNamespace(
        is_initialized=lambda: initialised,
        device_count=lambda: 1,
        memory_allocated=lambda i: 123_456_789,
    )
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    sampler = metrics.NvmlSampler(interval_s=30.0)
    sampler.sample_once()
    assert (
        value(scrape(metrics_port), "framefleet_torch_vram_allocated_bytes", device="cuda:0") == 0
    )
    initialised = True
    sampler.sample_once()
    assert (
        value(scrape(metrics_port), "framefleet_torch_vram_allocated_bytes", device="cuda:0")
        == 123_456_789
    )
    # When run as a thread with a long interval, stop() still returns at once.
    sampler.start()
    started = time.monotonic()
    sampler.stop(timeout=5)
    assert not sampler.is_alive() and time.monotonic() - started < 5


def test_sampler_without_nvidia_driver_leaves_gpu_series_absent(metrics_port: int) -> None:
    if _nvml_works():
        pytest.skip("this machine has a working NVIDIA driver")
    sampler = metrics.NvmlSampler()
    sampler.sample_once()
    assert not sampler.nvml_available
    sampler.close()
    names = {name for name, _ in scrape(metrics_port)}
    assert "framefleet_gpu_utilization_ratio" not in names
    assert "framefleet_gpu_memory_used_bytes" not in names


@pytest.mark.gpu
def test_sampler_reads_nvml_on_a_gpu_machine(metrics_port: int) -> None:
    if not _nvml_works():
        pytest.skip("no NVIDIA driver (NVML) on this machine")
    sampler = metrics.NvmlSampler(devices=[0])
    sampler.sample_once()
    assert sampler.nvml_available
    sampler.close()
    samples = scrape(metrics_port)
    used = [v for (n, _), v in samples.items() if n == "framefleet_gpu_memory_used_bytes"]
    util = [v for (n, _), v in samples.items() if n == "framefleet_gpu_utilization_ratio"]
    assert used and used[0] > 0
    assert util and 0.0 <= util[0] <= 1.0
