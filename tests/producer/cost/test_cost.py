"""The per-job cost model against hand computation, and the configured prices a worker uses."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from producer.cost import BYTES_PER_GB, configured_prices, cost_for_job, job_cost
from producer.cost.pricing import default_catalog, prices_for
from producer.settings import get_settings
from producer.wire.spec import (
    JobResult,
    Manifest,
    Prices,
    SegmentInfo,
    StageTimings,
    WorkerInfo,
    parse_spec,
)


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)


def make_result(
    job_id: str,
    tenant: str,
    *,
    node: str,
    finished_at: float,
    wall_s: float,
    video_seconds: float,
    prices: Prices | None,
    s3_puts: int = 0,
    stored_bytes: int = 0,
) -> JobResult:
    """A JobResult as a worker would return it; ``prices=None`` leaves out the cost report."""
    cost = None
    if prices is not None:
        cost = job_cost(
            tenant=tenant,
            prices=prices,
            gpu_seconds=wall_s,
            s3_puts=s3_puts,
            stored_bytes=stored_bytes,
            video_seconds=video_seconds,
        )
    segment = SegmentInfo(
        index=0,
        uri=f"s3://bucket/out/{tenant}/{job_id}/segment-00000.mp4",
        first_frame=0,
        frames=int(video_seconds * 16),
        bytes=stored_bytes,
        sha256="0" * 64,
        seconds=video_seconds,
    )
    return JobResult(
        manifest=Manifest(
            job_id=job_id,
            tenant=tenant,
            spec_digest="0" * 64,
            segments=(segment,),
            frames=int(video_seconds * 16),
            video_seconds=video_seconds,
            width=832,
            height=480,
            fps=16.0,
        ),
        manifest_uri=f"s3://bucket/out/{tenant}/{job_id}/manifest.json",
        timings=StageTimings(wall_s=wall_s, decode_s=wall_s * 0.8, gpu_busy_ratio=0.9),
        worker=WorkerInfo(hostname="host", node=node, pid=1, device="cuda:0"),
        cost=cost,
        finished_at=finished_at,
    )


# --- job cost ---------------------------------------------------------------------------------


def test_job_cost_matches_hand_computation() -> None:
    # Given a 2-GPU instance at $4.80/h: one GPU costs $2.40/h.
    prices = Prices(
        instance_type="x.test",
        region="us-east-2",
        capacity="on-demand",
        instance_usd_per_hour=4.8,
        gpus_per_instance=2,
        s3_put_usd_per_1000=0.005,
        s3_storage_usd_per_gb_month=0.023,
        sources=("test",),
    )
    report = job_cost(
        tenant="acme",
        prices=prices,
        gpu_seconds=90.0,
        s3_puts=4,
        stored_bytes=3 * BYTES_PER_GB,
        video_seconds=30.0,
    )
    gpu = 90 * 4.8 / 2 / 3600  # 0.06
    put = 4 * 0.005 / 1000  # 0.00002
    storage = 3 * 0.023  # 0.069
    total = gpu + put + storage  # 0.12902
    assert close(report.gpu_usd, 0.06) and close(report.gpu_usd, gpu)
    assert close(report.s3_put_usd, put)
    assert close(report.storage_usd_per_month, storage)
    assert close(report.total_usd, 0.12902) and close(report.total_usd, total)
    assert close(report.usd_per_video_minute, 0.12902 / 0.5)
    assert close(report.usd_per_1000_video_hours, 0.12902 / 30 * 3600 * 1000)
    assert report.prices == prices and report.tenant == "acme"


def test_job_cost_rejects_no_video_and_negative_inputs() -> None:
    prices = prices_for("g7e.2xlarge", "on-demand", default_catalog())
    args = {"tenant": "t", "prices": prices, "gpu_seconds": 1.0, "s3_puts": 0, "stored_bytes": 0}
    with pytest.raises(ValueError, match="video_seconds"):
        job_cost(**args, video_seconds=0.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gpu_seconds"):
        job_cost(**{**args, "gpu_seconds": -1.0}, video_seconds=1.0)  # type: ignore[arg-type]


def test_cost_for_job_uses_the_configured_prices(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Given a worker configured for spot g7e.12xlarge with a spot price in its pricing file.
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"instances": {"g7e.12xlarge": {"spot_usd_per_hour": 3.6}}}))
    monkeypatch.setenv("FRAMEFLEET_INSTANCE_TYPE", "g7e.12xlarge")
    monkeypatch.setenv("FRAMEFLEET_CAPACITY", "spot")
    monkeypatch.setenv("FRAMEFLEET_PRICING_FILE", str(path))
    get_settings.cache_clear()
    configured_prices.cache_clear()
    try:
        spec = parse_spec(
            {
                "job_id": "j1",
                "tenant": "acme",
                "input": {"uri": "file:///data/latents.npy"},
                "output": {"uri": "file:///data/out"},
            }
        )
        report = cost_for_job(spec, 100.0, 2, 0, 10.0)
    finally:
        get_settings.cache_clear()
        configured_prices.cache_clear()
    # $3.60/h over 2 GPUs = $1.80 per GPU-hour; 100 s = $0.05.
    assert report.tenant == "acme" and report.prices.capacity == "spot"
    assert close(report.gpu_usd, 0.05)
    assert close(report.total_usd, 0.05 + 2 * 0.005 / 1000)
