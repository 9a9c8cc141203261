"""The fleet view of cost: per-tenant totals, inferred fleet hours, utilisation-adjusted cost."""

from __future__ import annotations

import pytest

from producer.cost.fleet import fleet_summary, inferred_fleet_gpu_hours
from producer.cost.pricing import default_catalog, prices_for
from producer.wire.spec import JobResult
from tests.producer.cost.test_cost import close, make_result

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
