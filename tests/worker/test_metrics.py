"""Worker metrics scraped over real HTTP from a server of this test process."""

from __future__ import annotations

import re
import secrets
import sys
import time
import types
import urllib.request
from collections.abc import Iterator

import pytest

from producer.cost import job_cost
from producer.pricing import default_catalog, prices_for
from producer.spec import JobResult, Manifest, SegmentInfo, StageTimings, WorkerInfo
from tests.services import free_port
from worker import metrics

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape(port: int) -> Samples:
    """GET /metrics from loopback and parse the text format into {(name, labels): value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples: Samples = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if match and not line.startswith("#"):
            labels = frozenset(_LABEL.findall(match.group(2) or ""))
            samples[(match.group(1), labels)] = float(match.group(3))
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def make_result(tenant: str, *, reused: bool = False) -> JobResult:
    prices = prices_for("g7e.2xlarge", "on-demand", default_catalog())
    cost = job_cost(
        tenant=tenant,
        prices=prices,
        gpu_seconds=12.5,
        s3_puts=3,
        stored_bytes=3_000_000,
        video_seconds=6.0,
    )
    segments = tuple(
        SegmentInfo(
            index=i,
            uri=f"s3://b/out/{tenant}/j/segment-{i:05d}.mp4",
            first_frame=48 * i,
            frames=48,
            bytes=1_000_000,
            sha256="0" * 64,
            seconds=3.0,
        )
        for i in range(2)
    )
    timings = StageTimings(
        load_s=0.2,
        decode_s=9.5,
        postprocess_s=0.01,
        d2h_s=0.02,
        encode_s=1.5,
        upload_s=0.3,
        wall_s=12.5,
        gpu_busy_ratio=0.97,
    )
    return JobResult(
        manifest=Manifest(
            job_id="j",
            tenant=tenant,
            spec_digest="0" * 64,
            segments=segments,
            frames=96,
            video_seconds=6.0,
            width=832,
            height=480,
            fps=16.0,
        ),
        manifest_uri=f"s3://b/out/{tenant}/j/manifest.json",
        timings=timings,
        worker=WorkerInfo(hostname="h", node="gpu0@h", pid=1, device="cuda:0"),
        cost=cost,
        reused=reused,
        finished_at=time.time(),
    )


@pytest.fixture
def metrics_port() -> Iterator[int]:
    port = metrics.start_metrics_server(free_port(), addr="127.0.0.1")
    try:
        yield port
    finally:
        metrics.stop_metrics_server()


def test_port_zero_means_off() -> None:
    assert metrics.start_metrics_server(0) == 0


def test_observe_job_is_scraped_with_its_values(metrics_port: int) -> None:
    tenant = f"t{secrets.token_hex(4)}"
    before = scrape(metrics_port)
    result = make_result(tenant)

    metrics.observe_job("success", tenant, result)
    metrics.observe_job("failure", tenant, None)
    after = scrape(metrics_port)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert value(after, "framefleet_jobs_total", status="success", tenant=tenant) == 1
    assert value(after, "framefleet_jobs_total", status="failure", tenant=tenant) == 1
    assert result.cost is not None
    assert value(after, "framefleet_cost_usd_total", tenant=tenant) == pytest.approx(
        result.cost.total_usd, rel=1e-12
    )
    assert delta("framefleet_frames_total") == 96
    assert delta("framefleet_output_bytes_total") == 2_000_000
    assert delta("framefleet_video_seconds_total") == 6.0
    assert delta("framefleet_job_wall_seconds_count") == 1
    assert delta("framefleet_job_wall_seconds_sum") == pytest.approx(12.5)
    assert delta("framefleet_job_wall_seconds_bucket", le="20.0") == 1
    assert delta("framefleet_job_wall_seconds_bucket", le="10.0") == 0
    for stage, seconds in [("load", 0.2), ("decode", 9.5), ("encode", 1.5), ("upload", 0.3)]:
        assert delta("framefleet_stage_seconds_count", stage=stage) == 1
        assert delta("framefleet_stage_seconds_sum", stage=stage) == pytest.approx(seconds)
    assert value(after, "framefleet_gpu_busy_ratio", device="cuda:0") == 0.97
    price = {"instance_type": "g7e.2xlarge", "capacity": "on-demand"}
    assert value(after, "framefleet_gpu_cost_usd_per_hour", **price) == 3.36
    # The process collector is served too (process_start_time_seconds etc.).
    assert any(name.startswith("process_") for name, _ in after)


def test_reused_result_counts_the_job_but_not_its_timings(metrics_port: int) -> None:
    tenant = f"t{secrets.token_hex(4)}"
    before = scrape(metrics_port)
    metrics.observe_job("success", tenant, make_result(tenant, reused=True))
    after = scrape(metrics_port)
    assert value(after, "framefleet_jobs_total", status="success", tenant=tenant) == 1
    assert value(after, "framefleet_job_wall_seconds_count") == value(
        before, "framefleet_job_wall_seconds_count"
    )
    assert value(after, "framefleet_frames_total") == value(before, "framefleet_frames_total")


def test_unknown_status_is_refused() -> None:
    with pytest.raises(ValueError, match="status must be one of"):
        metrics.observe_job("done", "t", None)


def test_metric_names_cover_every_family() -> None:
    names = metrics.metric_names()
    for name in (
        "framefleet_jobs_total",
        "framefleet_job_wall_seconds_bucket",
        "framefleet_stage_seconds_sum",
        "framefleet_frames_total",
        "framefleet_output_bytes_total",
        "framefleet_gpu_busy_ratio",
        "framefleet_gpu_utilization_ratio",
        "framefleet_gpu_memory_used_bytes",
        "framefleet_torch_vram_allocated_bytes",
        "framefleet_cost_usd_total",
        "framefleet_queue_depth",
    ):
        assert name in names


# --- sampler ----------------------------------------------------------------------------------


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
