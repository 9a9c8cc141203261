"""The tables of ``framefleet cost report``: they fit 80 columns and never cut a value.

Every dollar amount is printed to the one precision of ``producer.cost.pricing.format_usd``. A
report of many columns would not fit 80 columns, so it is three narrow tables: the cost of the
jobs that finished, the utilisation-adjusted view, and (when there were any) the runs that
ended without a result.
"""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from producer.cost.fleet import FleetRow
from producer.cost.pricing import format_usd
from producer.wire.spec import HeldRun, JobResult


def narrow_table(title: str, columns: tuple[str, ...], first: str = "tenant") -> Table:
    """A table that fits 80 columns: no borders, headers that may wrap, numbers never cut
    (they do not wrap; a long tenant name or job key folds instead)."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  collapse_padding=True)
    table.add_column(first, overflow="fold", min_width=8)
    for name in columns:
        table.add_column(name, justify="right", no_wrap=True)
    return table


def report_tables(rows: list[FleetRow], total: FleetRow | None, title: str,
                  first: str = "tenant") -> list[Table]:
    """The report as two or three tables: cost of the jobs that finished, the utilisation-
    adjusted view, and (when there were any) the runs that ended without a result. ``first``
    names the rows' column (tenant, job)."""
    shown = [*rows, total] if total is not None else rows

    def name(row: FleetRow) -> str:
        return escape("total" if row is total else row.group)

    def usd(value: float) -> str:
        return format_usd(value, sign=False)

    direct = narrow_table(title, ("jobs", "video\nmin", "GPU-h", "$\ndirect", "$ per\nvideo-min"),
                          first)
    adjusted = narrow_table(
        "utilisation-adjusted: idle and wasted GPU time charged to the work served",
        ("$ held\nw/o result", "$ util-\nadjusted", "$ per\nvideo-min"), first,
    )
    held = narrow_table(
        "runs that ended without a result (failed, retried, cancelled): GPU time paid for",
        ("failed", "retried", "cancelled", "GPU-h", "$"), first,
    )
    for row in shown:
        style = "bold" if row is total else None
        direct.add_row(
            name(row), f"{row.jobs:,}", f"{row.video_minutes:,.2f}",
            f"{row.busy_gpu_hours:,.4f}", usd(row.direct_usd), usd(row.usd_per_video_minute),
            style=style,
        )  # fmt: skip
        adjusted.add_row(
            name(row), usd(row.held_usd), usd(row.adjusted_usd),
            usd(row.adjusted_usd_per_video_minute), style=style,
        )  # fmt: skip
        held.add_row(
            name(row), f"{row.failed_runs:,}", f"{row.retried_runs:,}",
            f"{row.cancelled_runs:,}", f"{row.held_gpu_hours:,.4f}", usd(row.held_usd),
            style=style,
        )  # fmt: skip
    any_held = any(r.failed_runs or r.retried_runs or r.cancelled_runs for r in rows)
    return [direct, adjusted, held] if any_held else [direct, adjusted]


def print_report(console: Console, rows: list[FleetRow], total_row: FleetRow | None,
                 everything: FleetRow, scope: str, results: list[JobResult],
                 held: list[HeldRun], first: str = "tenant") -> None:
    """The tables, then how the fleet's hours were found, the prices used, and what a CPU
    worker's price means."""
    for table in report_tables(rows, total_row, f"cost of jobs finished {scope}", first):
        console.print(table)
    how = ("inferred: first run start to last run end x distinct workers"
           if everything.fleet_gpu_hours_inferred else "given")
    console.print(f"fleet GPU-hours {everything.fleet_gpu_hours:,.4f} ({how}); "
                  f"utilisation {everything.utilisation:.1%} (every run, with or without result)")
    prices = [r.cost.prices for r in results if r.cost] + [h.prices for h in held if h.prices]
    for instance_type, capacity, usd in sorted(
        {(p.instance_type, p.capacity, p.instance_usd_per_hour) for p in prices}
    ):
        console.print(f"prices: {instance_type} {capacity} {format_usd(usd)}/h")
    if everything.cpu_runs:
        # Decided: a CPU worker is priced at its instance's per-GPU rate (the slot it holds on
        # a GPU host), not at a CPU price the catalog does not have. Said here, not hidden.
        console.print(
            f"note: {everything.cpu_runs:,} job(s) or run(s) ran on CPU workers; they are priced "
            "like one GPU of FRAMEFLEET_INSTANCE_TYPE (per-GPU $/h), not as CPU time"
        )
