"""The per-tier table of ``framefleet cost report``: what a denoise step costs at each speed
setting (``generate.tier`` and ``generate.cache``), over the generate jobs of the window."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from rich.table import Table

from producer.cost.pricing import format_usd
from producer.wire.spec import JobResult


@dataclasses.dataclass(frozen=True)
class TierRow:
    """One tier (and step cache) summed over generate jobs."""

    tier: str
    cache: str
    jobs: int
    steps: int
    denoise_gpu_seconds: float
    gpu_seconds_per_step: float
    denoise_usd: float


def tier_totals(results: Iterable[JobResult]) -> list[TierRow]:
    """Per (tier, cache), over the jobs whose cost report names a tier, in name order."""
    sums: dict[tuple[str, str], list[float]] = {}
    for r in results:
        cost = r.cost
        if cost is None or cost.tier is None:
            continue
        denoise = next((s for s in cost.stages if s.stage == "denoise"), None)
        acc = sums.setdefault((cost.tier, cost.cache or "none"), [0, 0, 0.0, 0.0])
        acc[0] += 1
        acc[1] += cost.denoise_steps
        acc[2] += denoise.gpu_seconds if denoise else 0.0
        acc[3] += denoise.usd if denoise else 0.0
    return [TierRow(tier, cache, int(jobs), int(steps), secs, secs / steps if steps else 0.0,
                    usd)
            for (tier, cache), (jobs, steps, secs, usd) in sorted(sums.items())]


def tier_table(rows: list[TierRow]) -> Table:
    table = Table(title="denoise per tier", title_justify="left")
    for name in ("tier", "cache", "jobs", "steps", "GPU-s", "GPU-s/step", "$ denoise"):
        table.add_column(name, justify="left" if name in ("tier", "cache") else "right")
    for row in rows:
        table.add_row(row.tier, row.cache, str(row.jobs), str(row.steps),
                      f"{row.denoise_gpu_seconds:,.2f}", f"{row.gpu_seconds_per_step:,.3f}",
                      format_usd(row.denoise_usd, sign=False))
    return table
