"""``framefleet cost report``'s per-tier table: GPU-seconds per denoise step by tier and cache."""

from __future__ import annotations

import pytest

from producer.cli.cost_tiers import tier_table, tier_totals
from producer.cost import with_denoise, with_stages
from producer.cost.pricing import default_catalog, prices_for
from producer.wire.spec import GenerateFacts
from tests.producer.cost.test_cost import make_result


def test_tier_totals_sum_denoise_per_tier_and_cache() -> None:
    prices = prices_for("g7e.2xlarge", "on-demand", default_catalog())

    def job(job_id: str, tier: str, cache: str, steps: int, denoise: float) -> object:
        r = make_result(job_id, "t", node="n", finished_at=1.0, wall_s=20.0,
                        video_seconds=5.0, prices=prices)
        assert r.cost is not None
        facts = GenerateFacts(tier=tier, cache=cache, steps=steps)
        cost = with_denoise(with_stages(r.cost, {"denoise": denoise}), facts, denoise)
        return r.model_copy(update={"cost": cost})

    decode_only = make_result("d", "t", node="n", finished_at=1.0, wall_s=3.0,
                              video_seconds=5.0, prices=prices)
    results = [job("a", "exact", "none", 20, 10.0), job("b", "exact", "none", 4, 2.0),
               job("c", "fp8", "none", 20, 8.0), job("e", "exact", "taylorseer", 20, 4.0),
               decode_only]
    rows = {(r.tier, r.cache): r for r in tier_totals(results)}  # type: ignore[arg-type]
    assert list(rows) == [("exact", "none"), ("exact", "taylorseer"), ("fp8", "none")]
    exact = rows[("exact", "none")]
    assert (exact.jobs, exact.steps) == (2, 24)
    assert exact.gpu_seconds_per_step == pytest.approx(12.0 / 24)
    assert rows[("fp8", "none")].gpu_seconds_per_step == pytest.approx(0.4)
    assert rows[("fp8", "none")].denoise_usd == pytest.approx(8.0 * prices.instance_usd_per_hour
                                                             / prices.gpus_per_instance / 3600)
    assert tier_table(list(rows.values())).row_count == 3
