"""``framefleet cost report``: cost per tenant (or per job) of the jobs that finished in a
window.

With a ledger (``FRAMEFLEET_LEDGER_URI``, or ``--ledger``) it reads the ledger's records of the
jobs that ended in the window (``producer.state.ledger``: a window's days are a window's prefixes),
which survive Redis losing its data. Without one, or with ``--backend``, it reads the JobResults
that workers left in the Celery result backend (Redis only), and the HeldRun records of runs
that ended without one (failed, retried, cancelled): what the backend still holds, since both
expire after ``result_expires_s``. Tables print every dollar amount to four decimals
(``producer.cost.pricing.format_usd``) and fit 80 columns; ``--json`` and ``--csv`` keep full
precision.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from producer.cli.cost_plot import require_matplotlib, write_plot
from producer.cli.cost_read import parse_duration, read_held, read_results
from producer.cli.cost_tiers import tier_table, tier_totals
from producer.cli.output import fail
from producer.cli.output import tables as console
from producer.cost import COST_STAGES
from producer.cost.fleet import FleetRow, Group, fleet_summary
from producer.cost.pricing import format_usd
from producer.cost.tables import print_report
from producer.errors import FramefleetError
from producer.settings import get_settings
from producer.state.ledger import open_ledger
from producer.wire.spec import HeldRun, JobResult


@dataclasses.dataclass(frozen=True)
class StageRow:
    """One stage summed over jobs: GPU-seconds, direct $ and share of the jobs' total $."""

    stage: str
    jobs: int
    gpu_seconds: float
    usd: float
    share: float


def stage_totals(results: Iterable[JobResult]) -> list[StageRow]:
    """Per stage (text_encode, denoise, decode, s3), over the jobs whose cost has stages."""
    sums = {stage: [0, 0.0, 0.0] for stage in COST_STAGES}
    for r in results:
        for row in r.cost.stages if r.cost is not None else ():
            acc = sums.setdefault(row.stage, [0, 0.0, 0.0])
            acc[0] += 1 if row.gpu_seconds > 0 or row.usd > 0 else 0
            acc[1] += row.gpu_seconds
            acc[2] += row.usd
    total = sum(acc[2] for acc in sums.values())
    return [StageRow(stage, int(jobs), secs, usd, usd / total if total > 0 else 0.0)
            for stage, (jobs, secs, usd) in sums.items() if jobs]


def _stage_table(rows: list[StageRow]) -> Table:
    table = Table(title="cost per stage", title_justify="left")
    for name in ("stage", "jobs", "GPU-s", "$ direct", "share"):
        table.add_column(name, justify="left" if name == "stage" else "right")
    for row in rows:
        table.add_row(row.stage, str(row.jobs), f"{row.gpu_seconds:,.2f}",
                      format_usd(row.usd, sign=False),
                      f"{row.share:.1%}")
    return table


def _row_dict(row: FleetRow) -> dict[str, Any]:
    return dataclasses.asdict(row)


def _read(since: float | None, backend: str | None,
          ledger: str | None) -> tuple[list[JobResult], list[HeldRun], str]:
    """Results and runs without one since ``since``, and where they came from."""
    reader = None if backend is not None else open_ledger(get_settings(), ledger)
    if reader is not None:
        records = reader.records(since)
        results = [r.result for r in records if r.result is not None]
        return results, [h for r in records for h in r.held], f"ledger {reader.uri}"
    from producer.app import make_app

    app = make_app(backend_url=backend)
    try:
        return read_results(app, since=since), read_held(app, since=since), "result backend"
    finally:
        app.close()


def report(
    since: Annotated[str, typer.Option(help="Window: 90m, 24h, 7d, 2w, or 'all'.")] = "24h",
    by: Annotated[str, typer.Option(
        help="'tenant', 'job' (a row per job key), or 'none' for one row.")] = "tenant",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="Print CSV instead of a table.")] = False,
    plot: Annotated[
        Path | None, typer.Option(help="Also write a PNG of $ per video-minute over time.")
    ] = None,
    bucket: Annotated[str, typer.Option(help="Time bucket of the plot, e.g. 15m, 1h.")] = "1h",
    fleet_gpu_hours: Annotated[
        float | None,
        typer.Option(help="GPU-hours the fleet was up in the window (default: inferred)."),
    ] = None,
    backend: Annotated[
        str | None, typer.Option(help="Read this result backend URL instead of the ledger.")
    ] = None,
    ledger: Annotated[
        str | None, typer.Option(help="The ledger to read (default: FRAMEFLEET_LEDGER_URI).")
    ] = None,
) -> None:
    """Cost per tenant (or job) of the jobs that finished in the window: direct, utilisation-
    adjusted, and the GPU time of runs that ended without a result (failed, retried,
    cancelled). Reads the ledger when there is one, else the result backend."""
    if as_json and as_csv:
        fail(ValueError("--json and --csv exclude each other"))
    if by not in ("tenant", "job", "none"):
        fail(ValueError(f"--by must be 'tenant', 'job' or 'none', got {by!r}"))
    group: Group = None if by == "none" else "job" if by == "job" else "tenant"
    try:
        window = parse_duration(since)
        bucket_s = parse_duration(bucket) or 3600.0
        if plot is not None:
            require_matplotlib()  # before any work: the answer would be lost otherwise
    except (ValueError, ImportError) as e:
        fail(e)
        return
    try:
        start = None if window is None else time.time() - window
        results, held, source = _read(start, backend, ledger)
        rows = fleet_summary(results, by=group, fleet_gpu_hours=fleet_gpu_hours, held=held)
        total = fleet_summary(results, by=None, fleet_gpu_hours=fleet_gpu_hours, held=held)
    except (FramefleetError, ValueError) as e:
        fail(e)
        return
    total_row = total[0] if total and group is not None else None
    if plot is not None:
        write_plot(results, plot, bucket_s=bucket_s, by="tenant" if group else None)
    if as_json:
        doc = {
            "since": since,
            "source": source,
            "jobs": len(results),
            "held_runs": len(held),
            "rows": [_row_dict(r) for r in rows],
            "total": _row_dict(total[0]) if total else None,
            "stages": [dataclasses.asdict(r) for r in stage_totals(results)],
            "tiers": [dataclasses.asdict(r) for r in tier_totals(results)],
            "prices": sorted({s for r in results if r.cost for s in r.cost.prices.sources}),
        }
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    if as_csv:
        fields = [f.name for f in dataclasses.fields(FleetRow)]
        writer = csv.DictWriter(sys.stdout, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow(_row_dict(row))
        if total_row is not None:
            writer.writerow({**_row_dict(total_row), "group": "(total)"})
        return
    scope = "in the last " + since.strip() if window is not None else "at any time"
    if not results and not held:
        console.print(f"no finished jobs in the {source} {scope}")
        return
    print_report(console, rows, total_row, total[0], scope, results, held,
                 "job" if group == "job" else "tenant")
    stages = stage_totals(results)
    if stages:
        console.print(_stage_table(stages))
    tiers = tier_totals(results)
    if tiers:
        console.print(tier_table(tiers))
    forgets = "" if source.startswith("ledger") else (
        " (it forgets after FRAMEFLEET_RESULT_EXPIRES_S, and with Redis's data: set "
        "FRAMEFLEET_LEDGER_URI for a durable history)")
    console.print(f"source: {source}{forgets}", markup=False)
    if plot is not None:
        console.print(f"plot written to {plot}")
