"""The cost model against hand computation, the override file, and the fleet summary."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from producer.cost import (
    BYTES_PER_GB,
    configured_prices,
    cost_for_job,
    default_catalog,
    job_cost,
    load_catalog,
    prices_for,
)
from producer.errors import (
    FatalJobError,
    FramefleetError,
    PricingError,
    RetryableError,
    UnknownInstanceTypeError,
)
from producer.fleet import fleet_summary, inferred_fleet_gpu_hours
from producer.settings import get_settings
from producer.spec import (
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


# --- catalog ----------------------------------------------------------------------------------


def test_default_catalog_has_the_g7e_sizes_with_dated_sources() -> None:
    catalog = default_catalog()
    gpus = {"2xlarge": 1, "4xlarge": 1, "8xlarge": 1, "12xlarge": 2, "24xlarge": 4, "48xlarge": 8}
    for size, count in gpus.items():
        entry = catalog.instances[f"g7e.{size}"]
        assert entry.gpus == count
        assert entry.on_demand_usd_per_hour > 0
        assert entry.source and entry.as_of[:4].isdigit()
    assert catalog.instances["g7e.2xlarge"].on_demand_usd_per_hour == 3.36
    assert catalog.instances["g7e.2xlarge"].region == "us-east-2"
    assert (catalog.s3.put_usd_per_1000, catalog.s3.storage_usd_per_gb_month) == (0.005, 0.023)


def test_prices_name_every_source() -> None:
    prices = prices_for("g7e.48xlarge", "on-demand", default_catalog())
    assert prices.gpus_per_instance == 8
    assert prices.instance_usd_per_hour == 33.14432
    assert len(prices.sources) == 2
    assert "g7e.48xlarge" in prices.sources[0] and "2026-" in prices.sources[0]
    assert "S3 Standard" in prices.sources[1] and "2026-" in prices.sources[1]


def test_unknown_instance_type_is_a_clear_value_error() -> None:
    with pytest.raises(UnknownInstanceTypeError, match=r"'p9\.huge'") as info:
        prices_for("p9.huge", "on-demand", default_catalog())
    assert isinstance(info.value, ValueError) and isinstance(info.value, FramefleetError)


def test_a_pricing_error_fails_a_job_at_once() -> None:
    # A retry would read the same catalog: pricing errors are fatal, never retried.
    with pytest.raises(FatalJobError):
        prices_for("g7e.2xlarge", "spot", default_catalog())
    assert not issubclass(PricingError, RetryableError)


def test_spot_without_a_configured_price_is_an_error() -> None:
    with pytest.raises(PricingError, match=r"no spot price for 'g7e\.2xlarge'"):
        prices_for("g7e.2xlarge", "spot", default_catalog())


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


# --- override file ----------------------------------------------------------------------------


def test_toml_override_changes_prices_and_names_its_source(tmp_path: Path) -> None:
    path = tmp_path / "prices.toml"
    path.write_text(
        """
[instances."g7e.2xlarge"]
on_demand_usd_per_hour = 3.0
spot_usd_per_hour = 1.25
source = "rate card"
as_of = 2026-10-01

[instances."g7e.96xlarge"]
on_demand_usd_per_hour = 60.0
gpus = 16
region = "us-west-2"

[s3]
storage_usd_per_gb_month = 0.02
"""
    )
    catalog = load_catalog(path)
    spot = prices_for("g7e.2xlarge", "spot", catalog)
    assert spot.instance_usd_per_hour == 1.25
    assert any("rate card (2026-10-01)" in s for s in spot.sources)
    assert prices_for("g7e.2xlarge", "on-demand", catalog).instance_usd_per_hour == 3.0
    new = prices_for("g7e.96xlarge", "on-demand", catalog)
    assert (new.gpus_per_instance, new.region) == (16, "us-west-2")
    # Entries without a source are labelled with the file name.
    assert any("prices.toml" in s for s in new.sources)
    assert new.s3_storage_usd_per_gb_month == 0.02 and new.s3_put_usd_per_1000 == 0.005
    # Untouched entries keep the built-in figures.
    assert prices_for("g7e.4xlarge", "on-demand", catalog).instance_usd_per_hour == 3.99816


def test_json_override_with_spot_discounts(tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    data = {
        "spot_discount": 0.5,
        "source": "team estimate",
        "as_of": "2026-10-02",
        "instances": {"g7e.12xlarge": {"spot_discount": 0.25}},
    }
    path.write_text(json.dumps(data))
    catalog = load_catalog(path)
    own = prices_for("g7e.12xlarge", "spot", catalog)
    assert close(own.instance_usd_per_hour, 8.28608 * 0.75)
    default = prices_for("g7e.2xlarge", "spot", catalog)
    assert close(default.instance_usd_per_hour, 3.36 * 0.5)
    assert any("team estimate (2026-10-02)" in s for s in default.sources)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"instances": {"g7e.2xlarge": {"on_demand_usd_per_hr": 1}}}, "on_demand_usd_per_hr"),
        ({"instances": {"g7e.2xlarge": {"on_demand_usd_per_hour": -1}}}, "on_demand_usd"),
        ({"instances": {"g7e.2xlarge": {"spot_discount": 1.5}}}, "spot_discount"),
        ({"instances": {"new.type": {"on_demand_usd_per_hour": 1.0}}}, "needs"),
        ({"s3": {"put_usd_per_1000": "cheap"}}, "put_usd_per_1000"),
    ],
)
def test_invalid_override_names_the_entry(tmp_path: Path, data: object, match: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PricingError, match=match):
        load_catalog(path)


def test_unparsable_or_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[instances\n")
    with pytest.raises(PricingError, match=r"bad\.toml"):
        load_catalog(bad)
    with pytest.raises(PricingError, match="not found"):
        load_catalog(tmp_path / "absent.json")


# --- fleet summary ----------------------------------------------------------------------------


def _three_jobs() -> list[JobResult]:
    prices = prices_for("g7e.2xlarge", "on-demand", default_catalog())  # $3.36/h, 1 GPU
    return [
        make_result(
            "a1",
            "a",
            node="w1",
            finished_at=1000,
            wall_s=100,
            video_seconds=60,
            prices=prices,
            s3_puts=2,
        ),
        make_result(
            "a2", "a", node="w2", finished_at=1300, wall_s=200, video_seconds=120, prices=prices
        ),
        make_result(
            "b1", "b", node="w1", finished_at=1500, wall_s=300, video_seconds=30, prices=prices
        ),
    ]


def test_fleet_summary_by_tenant_with_inferred_fleet_hours() -> None:
    results = _three_jobs()
    # Window: first start 1000-100=900 to last end 1500 = 600 s, x 2 workers = 1200 GPU-s.
    assert close(inferred_fleet_gpu_hours(results), 1200 / 3600)
    rows = fleet_summary(results, by="tenant", fleet_gpu_hours=None)
    a, b = rows
    # Busy 600 GPU-s of 1200: every GPU $ is doubled.
    assert (a.group, a.jobs, b.group, b.jobs) == ("a", 2, "b", 1)
    assert close(a.busy_gpu_hours, 300 / 3600) and close(a.video_minutes, 3.0)
    assert close(a.direct_gpu_usd, 300 * 3.36 / 3600)  # 0.28
    assert close(a.direct_usd, 0.28 + 2 * 0.005 / 1000)
    assert close(a.adjusted_gpu_usd, 0.56)
    assert close(a.adjusted_usd, 0.56 + 0.00001)
    assert close(a.usd_per_video_minute, 0.28001 / 3)
    assert close(a.adjusted_usd_per_video_minute, 0.56001 / 3)
    assert close(b.direct_usd, 0.28) and close(b.adjusted_usd, 0.56)
    assert close(b.usd_per_video_minute, 0.28 / 0.5)
    assert a.fleet_gpu_hours_inferred and close(a.utilisation, 0.5)
    assert close(a.fleet_gpu_hours, 1 / 3)


def test_fleet_summary_with_known_fleet_hours_and_one_row() -> None:
    results = _three_jobs()
    (row,) = fleet_summary(results, by=None, fleet_gpu_hours=0.5)
    # Busy 600 GPU-s = 1/6 h of 0.5 h: factor 3.
    assert row.group == "all" and row.jobs == 3 and not row.fleet_gpu_hours_inferred
    assert close(row.direct_gpu_usd, 0.56)
    assert close(row.adjusted_gpu_usd, 0.56 * 3)
    assert close(row.utilisation, 1 / 3)
    assert close(row.video_minutes, 3.5)
    with pytest.raises(ValueError, match="below the busy GPU-hours"):
        fleet_summary(results, by=None, fleet_gpu_hours=0.1)


def test_fleet_summary_counts_unpriced_jobs_without_cost() -> None:
    results = [*_three_jobs()]
    results.append(
        make_result(
            "c1", "c", node="w2", finished_at=1500, wall_s=60, video_seconds=10, prices=None
        ),
    )
    rows = {r.group: r for r in fleet_summary(results, fleet_gpu_hours=None)}
    c = rows["c"]
    assert (c.jobs, c.priced_jobs, c.direct_usd, c.usd_per_video_minute) == (1, 0, 0.0, 0.0)
    # Its GPU time still counts as busy: 660 busy GPU-s now.
    assert close(c.busy_gpu_hours, 60 / 3600)
    assert close(rows["a"].utilisation, 660 / 1200)
    assert fleet_summary([], fleet_gpu_hours=None) == []
