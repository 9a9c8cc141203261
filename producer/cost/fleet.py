"""Fleet view of cost-to-serve: per-tenant totals and utilisation-adjusted cost.

Pure functions over finished ``JobResult``s and the ``HeldRun`` records of runs that ended
without one (failed, retried, requeued, cancelled: their GPU was paid for too);
``producer/cli/cost.py`` reads both from the result backend's Redis. Direct cost is what each
job's CostReport says; held runs are priced at the prices their worker recorded. The
utilisation-adjusted cost charges each tenant its direct GPU $ and its held runs' $, scaled by
fleet GPU-hours ÷ busy GPU-hours (busy: every run, successful or not), so the fleet's idle
time and its wasted runs are both paid by the work it served.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from producer.cost import SECONDS_PER_HOUR, gpu_usd_per_second
from producer.wire.spec import HeldRun, JobResult, job_key

#: What ``fleet_summary`` groups by: a row per tenant, per job (its key), or one row.
Group = Literal["tenant", "job"] | None


@dataclass(frozen=True)
class FleetRow:
    """One row of the fleet summary (one tenant, one job's key, or ``"all"``).

    ``jobs`` are successful jobs (a JobResult); ``busy_gpu_hours`` is the GPU time they held.
    ``failed_runs``/``retried_runs`` (retries and requeues)/``cancelled_runs`` ended without a
    result; ``held_gpu_hours`` and ``held_usd`` are the GPU time and $ of those runs.
    ``adjusted_gpu_usd`` = (direct GPU $ + held $) × fleet GPU-hours ÷ busy GPU-hours of the
    fleet (all runs); ``adjusted_usd`` adds the (not utilisation-dependent) S3 $ back, so it
    compares with ``direct_usd``. ``cpu_runs`` counts jobs and runs on CPU workers: they are
    priced at the configured instance's per-GPU rate, like a GPU.
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
    failed_runs: int = 0
    retried_runs: int = 0
    cancelled_runs: int = 0
    held_gpu_hours: float = 0.0
    held_usd: float = 0.0
    cpu_runs: int = 0


def _busy_seconds(result: JobResult) -> float:
    # Jobs without a cost report still held a GPU for their wall time.
    return result.cost.gpu_seconds if result.cost is not None else result.timings.wall_s


def held_usd(run: HeldRun) -> float:
    """What a run without a result cost in GPU time, at its worker's prices (0: unpriced)."""
    return 0.0 if run.prices is None else run.gpu_seconds * gpu_usd_per_second(run.prices)


def is_cpu(device: str) -> bool:
    """Whether a WorkerInfo/HeldRun device is a CPU (``cpu``), not a GPU (``cuda:0``)."""
    return device.split(":", 1)[0] == "cpu"


def inferred_fleet_gpu_hours(results: Iterable[JobResult], held: Iterable[HeldRun] = ()) -> float:
    """Window from the first run start to the last run end * distinct workers (node).

    A job starts at ``finished_at - timings.wall_s``; a held run has its own start. This
    assumes every worker seen was up for the whole window and no other worker was: a lower
    bound when idle workers never ran a job, an upper bound when workers came and went.
    """
    spans = [(r.finished_at - r.timings.wall_s, r.finished_at, r.worker.node) for r in results]
    spans += [(h.started_at, h.finished_at, h.node) for h in held]
    if not spans:
        return 0.0
    start = min(s for s, _, _ in spans)
    end = max(e for _, e, _ in spans)
    workers = len({node for _, _, node in spans})
    return (end - start) * workers / SECONDS_PER_HOUR


def _group(by: Group, tenant: str, job_id: str) -> str:
    if by == "tenant":
        return tenant
    return job_key(tenant, job_id) if by == "job" else "all"


def fleet_summary(
    results: list[JobResult],
    *,
    by: Group = "tenant",
    fleet_gpu_hours: float | None = None,
    held: Sequence[HeldRun] = (),
) -> list[FleetRow]:
    """Aggregate job results and held runs per tenant (``by="tenant"``), per job (``"job"``:
    its key, ``tenant:job_id``) or in one row.

    Utilisation-adjusted $ = (direct GPU $ + held $) * fleet GPU-hours / busy GPU-hours
    (fleet-wide, every run), so idle GPU time the fleet paid for is charged to the work it
    served. When ``fleet_gpu_hours`` is None it is inferred by :func:`inferred_fleet_gpu_hours`
    (first run start to last run end * number of distinct workers), raised to the busy
    GPU-hours if smaller (overlapping windows cannot mean negative idle time). An explicit
    value below the busy GPU-hours is an error. Rows are sorted by group name.
    """
    if by not in ("tenant", "job", None):
        raise ValueError(f"by must be 'tenant', 'job' or None, got {by!r}")
    if not results and not held:
        return []
    busy_s = sum(_busy_seconds(r) for r in results) + sum(h.gpu_seconds for h in held)
    busy_hours = busy_s / SECONDS_PER_HOUR
    inferred = fleet_gpu_hours is None
    if fleet_gpu_hours is None:
        fleet_hours = max(inferred_fleet_gpu_hours(results, held), busy_hours)
    else:
        if fleet_gpu_hours < busy_hours * (1 - 1e-9):
            raise ValueError(
                f"fleet_gpu_hours {fleet_gpu_hours} is below the busy GPU-hours of these "
                f"jobs ({busy_hours:.6f})"
            )
        fleet_hours = fleet_gpu_hours
    factor = fleet_hours / busy_hours if busy_hours > 0 else 1.0
    groups: dict[str, tuple[list[JobResult], list[HeldRun]]] = {}
    for r in results:
        groups.setdefault(_group(by, r.manifest.tenant, r.manifest.job_id), ([], []))[0].append(r)
    for h in held:
        groups.setdefault(_group(by, h.tenant, h.job_id), ([], []))[1].append(h)
    rows = []
    for name in sorted(groups):
        items, runs = groups[name]
        costs = [r.cost for r in items if r.cost is not None]
        video_minutes = sum(r.manifest.video_seconds for r in items) / 60.0
        priced_minutes = sum(c.video_seconds for c in costs) / 60.0
        gpu_usd = sum(c.gpu_usd for c in costs)
        direct = sum(c.total_usd for c in costs)
        wasted = sum(held_usd(h) for h in runs)
        adjusted_gpu = (gpu_usd + wasted) * factor
        adjusted = direct - gpu_usd + adjusted_gpu
        ends = [r.finished_at for r in items] + [h.finished_at for h in runs]
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
                first_finished_at=min(ends),
                last_finished_at=max(ends),
                failed_runs=sum(h.status == "failure" for h in runs),
                retried_runs=sum(h.status in ("retry", "requeue") for h in runs),
                cancelled_runs=sum(h.status == "cancelled" for h in runs),
                held_gpu_hours=sum(h.gpu_seconds for h in runs) / SECONDS_PER_HOUR,
                held_usd=wasted,
                cpu_runs=sum(is_cpu(r.worker.device) for r in items)
                + sum(is_cpu(h.device) for h in runs),
            )
        )
    return rows
