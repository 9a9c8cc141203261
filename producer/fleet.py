"""Fleet view of cost-to-serve: per-tenant totals and utilisation-adjusted cost.

Pure functions over finished ``JobResult``s (``producer/cli_cost.py`` reads them from the
result backend). Direct cost is what each job's CostReport says; the utilisation-adjusted cost
spreads the fleet's idle GPU time over the jobs: fleet GPU-hours ÷ busy GPU-hours.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from producer.cost import SECONDS_PER_HOUR
from producer.spec import JobResult


@dataclass(frozen=True)
class FleetRow:
    """One row of the fleet summary (one tenant, or ``"all"``).

    ``busy_gpu_hours`` is GPU time held by jobs; ``adjusted_gpu_usd`` spreads the fleet's idle
    GPU time over the rows in proportion to their direct GPU $; ``adjusted_usd`` adds the
    (not utilisation-dependent) S3 $ back, so it compares with ``direct_usd``.
    """

    group: str
    jobs: int
    priced_jobs: int
    video_minutes: float
    busy_gpu_hours: float
    direct_gpu_usd: float
    direct_usd: float
    adjusted_gpu_usd: float
    adjusted_usd: float
    usd_per_video_minute: float
    adjusted_usd_per_video_minute: float
    fleet_gpu_hours: float
    fleet_gpu_hours_inferred: bool
    utilisation: float
    first_finished_at: float
    last_finished_at: float


def _busy_seconds(result: JobResult) -> float:
    # Jobs without a cost report still held a GPU for their wall time.
    return result.cost.gpu_seconds if result.cost is not None else result.timings.wall_s


def inferred_fleet_gpu_hours(results: Iterable[JobResult]) -> float:
    """Window from the first job start to the last job end * distinct workers (worker.node).

    A job starts at ``finished_at - timings.wall_s``. This assumes every worker seen was up
    for the whole window and no other worker was: a lower bound when idle workers never ran a
    job, an upper bound when workers came and went.
    """
    items = list(results)
    if not items:
        return 0.0
    start = min(r.finished_at - r.timings.wall_s for r in items)
    end = max(r.finished_at for r in items)
    workers = len({r.worker.node for r in items})
    return (end - start) * workers / SECONDS_PER_HOUR


def fleet_summary(
    results: list[JobResult],
    *,
    by: Literal["tenant"] | None = "tenant",
    fleet_gpu_hours: float | None = None,
) -> list[FleetRow]:
    """Aggregate job results per tenant (``by="tenant"``) or in one row (``by=None``).

    Utilisation-adjusted $ = direct GPU $ * fleet GPU-hours / busy GPU-hours (fleet-wide), so
    idle GPU time the fleet paid for is charged to the work it served. When ``fleet_gpu_hours``
    is None it is inferred by :func:`inferred_fleet_gpu_hours` (first job start to last job
    end * number of distinct workers), raised to the busy GPU-hours if smaller (overlapping
    windows cannot mean negative idle time). An explicit value below the busy GPU-hours is an
    error. Rows are sorted by group name.
    """
    if by not in ("tenant", None):
        raise ValueError(f"by must be 'tenant' or None, got {by!r}")
    if not results:
        return []
    busy_hours = sum(_busy_seconds(r) for r in results) / SECONDS_PER_HOUR
    inferred = fleet_gpu_hours is None
    if fleet_gpu_hours is None:
        fleet_hours = max(inferred_fleet_gpu_hours(results), busy_hours)
    else:
        if fleet_gpu_hours < busy_hours * (1 - 1e-9):
            raise ValueError(
                f"fleet_gpu_hours {fleet_gpu_hours} is below the busy GPU-hours of these "
                f"jobs ({busy_hours:.6f})"
            )
        fleet_hours = fleet_gpu_hours
    factor = fleet_hours / busy_hours if busy_hours > 0 else 1.0
    groups: dict[str, list[JobResult]] = {}
    for r in results:
        groups.setdefault(r.manifest.tenant if by == "tenant" else "all", []).append(r)
    rows = []
    for name in sorted(groups):
        items = groups[name]
        costs = [r.cost for r in items if r.cost is not None]
        video_minutes = sum(r.manifest.video_seconds for r in items) / 60.0
        priced_minutes = sum(c.video_seconds for c in costs) / 60.0
        gpu_usd = sum(c.gpu_usd for c in costs)
        direct = sum(c.total_usd for c in costs)
        adjusted_gpu = gpu_usd * factor
        adjusted = direct - gpu_usd + adjusted_gpu
        rows.append(
            FleetRow(
                group=name,
                jobs=len(items),
                priced_jobs=len(costs),
                video_minutes=video_minutes,
                busy_gpu_hours=sum(_busy_seconds(r) for r in items) / SECONDS_PER_HOUR,
                direct_gpu_usd=gpu_usd,
                direct_usd=direct,
                adjusted_gpu_usd=adjusted_gpu,
                adjusted_usd=adjusted,
                # Rates over the jobs that carry a price, so unpriced jobs do not dilute them.
                usd_per_video_minute=direct / priced_minutes if priced_minutes else 0.0,
                adjusted_usd_per_video_minute=adjusted / priced_minutes if priced_minutes else 0.0,
                fleet_gpu_hours=fleet_hours,
                fleet_gpu_hours_inferred=inferred,
                utilisation=busy_hours / fleet_hours if fleet_hours else 0.0,
                first_finished_at=min(r.finished_at for r in items),
                last_finished_at=max(r.finished_at for r in items),
            )
        )
    return rows
