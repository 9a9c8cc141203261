"""The storm's figures: one line for the test's output, and ``bench/results/storm-cpu.md``."""

from __future__ import annotations

import os
import platform
import textwrap
from datetime import UTC, datetime
from typing import Any

from tests.e2e.storm import CATEGORY, Plan


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _spread(values: list[float]) -> str:
    return (f"{percentile(values, 0.5):.1f} s / {percentile(values, 0.99):.1f} s "
            f"({len(values)})")


def summary(plan: Plan, f: dict[str, Any]) -> str:
    return (f"storm seed {plan.seed}: {len(plan.jobs)} jobs, {len(plan.faults)} faults "
            f"{plan.per_category()}, ends {f['ends']}, counted {f['counted']}, ledger records "
            f"{f['records']}, lost {len(f['open'])}, succeeded twice {f['succeeded_twice']}, "
            f"written after the end {f['written_late']}, open playlists {f['open_playlists']}, "
            f"zombie runs {f['zombies']} ({f['stopped']} stopped without an end), "
            f"redelivery after a kill p50/p99 "
            f"{_spread(f['delays'])}, after a cut from Redis {_spread(f['detected'])}, sent "
            f"again by the reconciler {f['resent']}, requeued by the sweep {f['requeued']}, "
            f"storm {f['storm_s']:.0f} s, test {f['wall_s']:.0f} s, problems "
            f"{len(f['problems'])}")


def results_md(plan: Plan, log: dict[int, str], n_hosts: int, f: dict[str, Any]) -> str:
    """``bench/results/storm-cpu.md``: the command, the figures and the fault schedule."""
    gateway = sum(j.via == "gateway" for j in plan.jobs)
    per = plan.per_category()
    counts = ", ".join(f"{c} {per.get(c, 0)}" for c in ("kills", "outages", "partitions",
                                                        "slow links", "cancels"))
    kinds = ", ".join(f"{kind} {sum(x.kind == kind for x in plan.faults)}" for kind in CATEGORY
                      if any(x.kind == kind for x in plan.faults))
    rows = "\n".join(
        f"| {fault.at_s:.1f} | {fault.lane(n_hosts)} | {fault.kind} | {log.get(i, 'not run')} |"
        for i, fault in enumerate(plan.faults))
    problems = "\n".join("- " + p for p in f["problems"]) or "none"
    return f"""# Storm on CPU ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC)

Command (from the repo root, as root: the hosts live in network namespaces; `make chaos` runs
it with the rest):

    FRAMEFLEET_CHAOS_FULL=1 FRAMEFLEET_STORM_SEED={plan.seed} \\
        python -m pytest -m chaos tests/e2e/test_storm.py

Machine: {os.cpu_count()} cores ({platform.machine()}). Real Redis (append-only, fsync always),
SeaweedFS (`weed mini`) and two gateway replicas in one network namespace; three CPU workers
on two hosts (2 + 1), each host in a namespace of its own joined to the services' by a veth
pair; `FRAMEFLEET_RECONCILE_AFTER_S=10`, the lease (10 s) and the host-loss sweep (2 s, 10 s
grace) at their defaults.

{textwrap.fill(f"Faults (drawn from the seed): {kinds}.", 95)} A cut from Redis holds 12-15 s
(longer than the lease: the host is taken for lost, and a run it had becomes a zombie), a cut
from S3 2-6 s, a slow link (`htb` + `tbf` on the host's path to S3's port: 64 kbit/s, 256
kbit/s or 1 Mbit/s) 3-8 s. A fault on a host waits up to 3 s for a job to run there.

## Figures

| | |
|---|---|
| seed | {plan.seed} |
| jobs | {len(plan.jobs)} ({gateway} through the gateway, the rest through the client) |
| faults | {len(plan.faults)}: {counts} |
| ends | {f["ends"]} |
| lost | {len(f["open"])} |
| jobs that succeeded twice (workers' logs) | {f["succeeded_twice"]} |
| ledger records | {f["records"]} |
| `framefleet_jobs_total` scraped (sum over process lives) | {f["counted"]} |
| objects written after their job's end | {f["written_late"]} |
| zombie runs that learnt they lost the lease (their jobs) | {f["zombies"]} ({f["zombie_jobs"]}) |
| ... that stopped without an end | {f["stopped"]} |
| playlists left open | {f["open_playlists"]} |
| redelivery after a kill, p50 / p99 (n) | {_spread(f["delays"])} |
| delivered again after a cut from Redis, p50 / p99 (n) | {_spread(f["detected"])} |
| sent again by the lost-message reconciler | {f["resent"]} |
| requeued by the host-loss sweep | {f["requeued"]} |
| storm, first submit to every job final | {f["storm_s"]:.0f} s |
| the last fault ended | {f["faults_s"]:.0f} s after the first submit |
| the whole test, fleet start to checks done | {f["wall_s"]:.0f} s |
| problems | {len(f["problems"])} |

Counts of a pool process killed within the scrape period (0.5 s) of an end die with it
(Prometheus counters live in the process), so the scraped sum may fall short of the ends; it
never exceeds them.

## Fault schedule (drawn from the seed)

Each lane runs its faults one after another: a fault starts at its planned time or, if the one
before in its lane still runs, when it ends. `fleet`: kills, outages, cancels; `host0`
(storm-a), `host1` (storm-b): that host's partitions and slow links.

| planned t (s) | lane | fault | what happened |
|---|---|---|---|
{rows}

## Problems

{problems}
"""
