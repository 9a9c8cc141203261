"""``framefleet cost``: cost reports from finished jobs, and the price catalog (typer + rich).

``report`` reads the JobResults that workers left in the Celery result backend (Redis only),
and the HeldRun records of runs that ended without one (failed, retried, cancelled), so it
sees what the backend still holds: both expire after ``result_expires_s``. Tables print every
dollar amount to four decimals (``producer.cost.pricing.format_usd``) and fit 80 columns; ``--json``
and ``--csv`` keep full precision.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import itertools
import json
import math
import re
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
from pydantic import ValidationError
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from producer.cost import COST_STAGES
from producer.cost.fleet import FleetRow, fleet_summary
from producer.cost.pricing import Catalog, format_usd, load_catalog, prices_for
from producer.cost.tables import print_report
from producer.errors import FramefleetError, PricingError, UnsupportedBackendError
from producer.keys import HELD_PREFIX
from producer.settings import get_settings
from producer.spec import HeldRun, JobResult

if TYPE_CHECKING:
    from celery import Celery

cost_app = typer.Typer(
    help="Cost-to-serve: reports from finished jobs, and the price catalog.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console()
err = Console(stderr=True)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}


def parse_duration(text: str) -> float | None:
    """``90s``, ``30m``, ``24h``, ``7d``, ``2w`` → seconds; ``all`` → None (no limit)."""
    if text.strip().lower() == "all":
        return None
    match = _DURATION.match(text.lower())
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"not a duration: {text!r} (use e.g. 90m, 24h, 7d, or 'all')")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def _batched(items: Iterable[bytes], size: int) -> Iterator[list[bytes]]:
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def read_results(app: Celery, *, since: float | None = None, batch: int = 500) -> list[JobResult]:
    """JobResults of SUCCESS tasks in the app's Redis result backend, oldest first.

    Scans the ``celery-task-meta-*`` keys (SCAN, so Redis is never blocked), decodes each with
    the backend's own serializer and keeps the results that validate as :class:`JobResult`
    (other tasks' results are skipped) and finished at or after ``since`` (unix time).
    Raises :class:`UnsupportedBackendError` for any backend other than Redis.
    """
    from celery.backends.redis import RedisBackend

    backend = app.backend
    if not isinstance(backend, RedisBackend):
        raise UnsupportedBackendError(
            f"cost report reads finished jobs from a Redis result backend; "
            f"{type(backend).__name__} is not supported"
        )
    prefix = backend.task_keyprefix  # bytes; includes any global_keyprefix
    client = backend.client
    results = []
    for keys in _batched(client.scan_iter(match=prefix + b"*", count=batch), batch):
        for raw in client.mget(keys):
            if raw is None:  # expired between SCAN and MGET
                continue
            meta = backend.decode(raw)
            if not isinstance(meta, dict) or meta.get("status") != "SUCCESS":
                continue
            try:
                result = JobResult.model_validate(meta.get("result"))
            except ValidationError:
                continue
            if since is None or result.finished_at >= since:
                results.append(result)
    results.sort(key=lambda r: r.finished_at)
    return results


def read_held(app: Celery, *, since: float | None = None, batch: int = 500) -> list[HeldRun]:
    """The HeldRun records (runs without a JobResult) in the app's Redis, oldest first.

    Written by the workers next to the results (``producer.keys.held``); records that
    do not validate are skipped. Raises :class:`UnsupportedBackendError` unless Redis.
    """
    from celery.backends.redis import RedisBackend

    backend = app.backend
    if not isinstance(backend, RedisBackend):
        raise UnsupportedBackendError(
            f"cost report reads finished jobs from a Redis result backend; "
            f"{type(backend).__name__} is not supported"
        )
    client = backend.client
    held = []
    for keys in _batched(client.scan_iter(match=HELD_PREFIX + "*", count=batch), batch):
        for raw in client.mget(keys):
            if raw is None:
                continue
            try:
                run = HeldRun.model_validate_json(raw)
            except ValidationError:
                continue
            if since is None or run.finished_at >= since:
                held.append(run)
    held.sort(key=lambda h: h.finished_at)
    return held


def cost_over_time(
    results: Iterable[JobResult], *, bucket_s: float, by: Literal["tenant"] | None = "tenant"
) -> dict[str, list[tuple[float, float]]]:
    """Direct $ per video-minute per ``bucket_s`` of ``finished_at``, per group, time-sorted.

    Jobs without a cost report are left out.
    """
    sums: dict[str, dict[float, list[float]]] = {}
    for r in results:
        if r.cost is None:
            continue
        group = r.manifest.tenant if by == "tenant" else "all"
        start = math.floor(r.finished_at / bucket_s) * bucket_s
        acc = sums.setdefault(group, {}).setdefault(start, [0.0, 0.0])
        acc[0] += r.cost.total_usd
        acc[1] += r.cost.video_seconds / 60.0
    return {
        group: [(t, usd / minutes) for t, (usd, minutes) in sorted(buckets.items()) if minutes]
        for group, buckets in sorted(sums.items())
    }


#: What ``--plot`` needs, and the extra that installs it.
PLOT_MISSING = "--plot needs matplotlib, which is not installed: pip install 'framefleet[plot]'"


def require_matplotlib() -> None:
    """Raise ``ImportError`` with :data:`PLOT_MISSING` unless matplotlib can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise ImportError(PLOT_MISSING) from e


def write_plot(results: list[JobResult], path: Path, *, bucket_s: float, by: str | None) -> None:
    """PNG of $ per video-minute over time, one line per group (matplotlib, Agg backend)."""
    require_matplotlib()
    import matplotlib.dates as mdates
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # A Figure with an Agg canvas, not pyplot: no global state, no display needed.
    fig = Figure(figsize=(9, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    series = cost_over_time(results, bucket_s=bucket_s, by="tenant" if by == "tenant" else None)
    for group, points in series.items():
        stamps = [dt.datetime.fromtimestamp(t, tz=dt.UTC) for t, _ in points]
        times = mdates.date2num(stamps)  # type: ignore[no-untyped-call]
        ax.plot(times, [v for _, v in points], marker="o", label=group)
    ax.xaxis_date(tz=dt.UTC)
    ax.set_title(f"$ per video-minute (direct), {bucket_s / 60:g}-minute buckets")
    ax.set_ylabel("USD per video-minute")
    ax.set_xlabel("finished (UTC)")
    locator = ax.xaxis.get_major_locator()
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]
    highest = max((v for points in series.values() for _, v in points), default=0.0)
    ax.set_ylim(0, highest * 1.15 or 1.0)  # headroom, also when every point is equal
    ax.grid(True, alpha=0.3)
    if series:
        ax.legend(loc="best", fontsize="small")
    fig.savefig(path, dpi=110)


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
        table.add_row(row.stage, str(row.jobs), f"{row.gpu_seconds:,.2f}", f"{row.usd:,.6f}",
                      f"{row.share:.1%}")
    return table


def _row_dict(row: FleetRow) -> dict[str, Any]:
    return dataclasses.asdict(row)


def _fail(e: Exception) -> None:
    # escape: a message may hold brackets (the pricing hint's [instances."..."]), not markup.
    err.print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True)
    raise typer.Exit(1)


@cost_app.command("report")
def report(
    since: Annotated[str, typer.Option(help="Window: 90m, 24h, 7d, 2w, or 'all'.")] = "24h",
    by: Annotated[str, typer.Option(help="'tenant', or 'none' for one row.")] = "tenant",
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
        str | None, typer.Option(help="Result backend URL (default: from FRAMEFLEET_*).")
    ] = None,
) -> None:
    """Cost per tenant of the jobs that finished in the window: direct, utilisation-adjusted,
    and the GPU time of runs that ended without a result (failed, retried, cancelled)."""
    if as_json and as_csv:
        _fail(ValueError("--json and --csv exclude each other"))
    if by not in ("tenant", "none"):
        _fail(ValueError(f"--by must be 'tenant' or 'none', got {by!r}"))
    group: Literal["tenant"] | None = "tenant" if by == "tenant" else None
    try:
        window = parse_duration(since)
        bucket_s = parse_duration(bucket) or 3600.0
        if plot is not None:
            require_matplotlib()  # before any work: the answer would be lost otherwise
    except (ValueError, ImportError) as e:
        _fail(e)
        return
    from producer.app import make_app

    app = make_app(backend_url=backend)
    try:
        start = None if window is None else time.time() - window
        results = read_results(app, since=start)
        held = read_held(app, since=start)
        rows = fleet_summary(results, by=group, fleet_gpu_hours=fleet_gpu_hours, held=held)
        total = fleet_summary(results, by=None, fleet_gpu_hours=fleet_gpu_hours, held=held)
    except (FramefleetError, ValueError) as e:
        _fail(e)
        return
    finally:
        app.close()
    total_row = total[0] if total and group == "tenant" else None
    if plot is not None:
        write_plot(results, plot, bucket_s=bucket_s, by=group)
    if as_json:
        doc = {
            "since": since,
            "jobs": len(results),
            "held_runs": len(held),
            "rows": [_row_dict(r) for r in rows],
            "total": _row_dict(total[0]) if total else None,
            "stages": [dataclasses.asdict(r) for r in stage_totals(results)],
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
        console.print(f"no finished jobs in the result backend {scope}")
        return
    print_report(console, rows, total_row, total[0], scope, results, held)
    stages = stage_totals(results)
    if stages:
        console.print(_stage_table(stages))
    if plot is not None:
        console.print(f"plot written to {plot}")


def _catalog(pricing_file: Path | None) -> Catalog:
    path = pricing_file if pricing_file is not None else get_settings().pricing_file
    return load_catalog(path)


@cost_app.command("prices")
def prices(
    instance_type: Annotated[
        str | None, typer.Option(help="Show the prices one worker on this type pays.")
    ] = None,
    capacity: Annotated[str, typer.Option(help="'on-demand' or 'spot'.")] = "on-demand",
    pricing_file: Annotated[
        Path | None, typer.Option(help="JSON/TOML override (default: FRAMEFLEET_PRICING_FILE).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """The price catalog with its sources, or the prices of one instance type."""
    if capacity not in ("on-demand", "spot"):
        _fail(ValueError(f"--capacity must be 'on-demand' or 'spot', got {capacity!r}"))
    cap: Literal["on-demand", "spot"] = "spot" if capacity == "spot" else "on-demand"
    try:
        catalog = _catalog(pricing_file)
        if instance_type is not None:
            chosen = prices_for(instance_type, cap, catalog)
    except (PricingError, ValueError) as e:
        _fail(e)
        return
    if instance_type is not None:
        if as_json:
            sys.stdout.write(chosen.model_dump_json(indent=2) + "\n")
            return
        console.print(
            f"{chosen.instance_type} ({chosen.region}, {chosen.capacity}): "
            f"{format_usd(chosen.instance_usd_per_hour)}/h for {chosen.gpus_per_instance} GPU(s)"
            f" = {format_usd(chosen.instance_usd_per_hour / chosen.gpus_per_instance)}"
            " per GPU-hour",
            highlight=False,
        )
        console.print(
            f"S3: {format_usd(chosen.s3_put_usd_per_1000)} per 1000 PUT, "
            f"{format_usd(chosen.s3_storage_usd_per_gb_month)} per GB-month",
            highlight=False,
        )
        for source in chosen.sources:
            console.print(f"  source: {source}", highlight=False)
        return
    entries = sorted(catalog.instances.values(), key=lambda e: (e.on_demand_usd_per_hour, e.gpus))
    if as_json:
        doc = {
            "instances": [dataclasses.asdict(e) for e in entries],
            "s3": dataclasses.asdict(catalog.s3),
            "spot_discount": catalog.spot_discount,
        }
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    table = Table(title=f"instance prices ({cap})", title_justify="left", box=box.SIMPLE_HEAD,
                  pad_edge=False, collapse_padding=True)
    for name in ("type", "region", "GPUs", "$/h", "$/GPU-h", "source"):
        right = name.startswith(("$", "GPU"))
        table.add_column(name, justify="right" if right else "left", no_wrap=right)
    notes: list[str] = []  # long source strings go below the table, numbered
    for entry in entries:
        try:
            usd = prices_for(entry.instance_type, cap, catalog).instance_usd_per_hour
            cells = (format_usd(usd, sign=False), format_usd(usd / entry.gpus, sign=False))
        except PricingError:  # spot without a configured price
            cells = ("-", "-")
        spot = cap == "spot" and entry.spot_source is not None
        source = entry.spot_source if spot and entry.spot_source else entry.source
        date = entry.spot_as_of if spot and entry.spot_as_of else entry.as_of
        if source not in notes:
            notes.append(source)
        note = f"[{notes.index(source) + 1}] {date}"
        table.add_row(entry.instance_type, entry.region, str(entry.gpus), *cells, note)
    console.print(table)
    for number, source in enumerate(notes, 1):
        console.print(f"[{number}] {source}", highlight=False, markup=False)
    s3 = catalog.s3
    console.print(
        f"S3 Standard {s3.region}: {format_usd(s3.put_usd_per_1000)} per 1000 PUT, "
        f"{format_usd(s3.storage_usd_per_gb_month)} per GB-month ({s3.source}, {s3.as_of})",
        highlight=False, markup=False,
    )
    if cap == "spot" and catalog.spot_discount is None:
        console.print(
            'spot prices without an entry: set them in the pricing file, e.g. '
            '[instances."g7e.2xlarge"] spot_usd_per_hour = 1.45 (see producer/cost/pricing.py)',
            highlight=False, markup=False,
        )
