"""``framefleet jobs``: the jobs that ended, from the durable ledger (``producer.state.ledger``).

``list`` filters by tenant, end state and time; ``show`` prints one job's records (each end of
it): states with their times, seconds per stage, cost, output URIs, runs without a result.
Both read ``FRAMEFLEET_LEDGER_URI`` (or ``--ledger``), never Redis: what they show survives
a Redis that lost its data.
"""

from __future__ import annotations

import datetime as dt
import sys
import time
from typing import Annotated, Optional

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from producer.cli.cost_read import parse_duration
from producer.cli.output import console, count, errors, fail
from producer.cli.output import tables as table_console
from producer.errors import LedgerError
from producer.settings import get_settings
from producer.state.ledger import LedgerReader, open_ledger
from producer.wire.results import LedgerRecord
from producer.wire.spec import split_key
from producer.wire.weights import NOISE_NOTE

jobs_app = typer.Typer(help="Jobs that ended (succeeded, failed, cancelled), from the ledger.",
                       no_args_is_help=True, pretty_exceptions_enable=False)
#: ``--state`` values, as ``status`` prints them or as the ledger spells them.
STATES = {"success": "success", "failure": "failure", "cancelled": "cancelled",
          "revoked": "cancelled"}
LedgerOpt = Annotated[Optional[str], typer.Option(
    metavar="URI", help="the ledger to read (default: FRAMEFLEET_LEDGER_URI)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the records as JSON lines")]
#: Piped output's table width: no row is that long, so none is folded.
PIPED_WIDTH = 100_000


def parse_when(text: str) -> float | None:
    """``7d`` (that long ago), ``2026-12-01`` or ``2026-12-01T12:00`` (UTC), or ``all``."""
    try:
        ago = parse_duration(text)
    except ValueError:
        try:
            when = dt.datetime.fromisoformat(text.strip())
        except ValueError:
            raise ValueError(f"not a time: {text!r} (use e.g. 24h, 7d, 2026-12-01, or "
                             "'all')") from None
        return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).timestamp()
    return None if ago is None else time.time() - ago


def _reader(ledger: str | None) -> LedgerReader:
    reader = open_ledger(get_settings(), ledger)
    if reader is None:
        raise LedgerError("no ledger: set FRAMEFLEET_LEDGER_URI (s3://bucket/prefix or "
                          "file:///folder) on the workers and here, or pass --ledger")
    return reader


def _utc(t: float) -> str:
    return dt.datetime.fromtimestamp(t, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _usd(r: LedgerRecord) -> float:
    from producer.cost.fleet import held_usd

    cost = r.result.cost if r.result is not None else None
    return (cost.total_usd if cost is not None else 0.0) + sum(held_usd(h) for h in r.held)


@jobs_app.command("list")
def list_jobs(
    tenant: Annotated[Optional[str], typer.Option(metavar="NAME", help="one tenant's")] = None,
    state: Annotated[Optional[str], typer.Option(
        metavar="STATE", help="success | failure | cancelled (REVOKED)")] = None,
    since: Annotated[str, typer.Option(
        metavar="WHEN", help="ended after: 24h, 7d, 2026-12-01, or 'all'")] = "24h",
    until: Annotated[Optional[str], typer.Option(
        metavar="WHEN", help="ended before (same forms)")] = None,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The jobs that ended in a window, oldest first: end time (UTC), job, state, worker,
    GPU-seconds, $ (direct, with the runs without a result) and the reason of a failure."""
    with errors():
        wanted = None if state is None else STATES.get(state.lower())
        if state is not None and wanted is None:
            raise ValueError(f"--state: {state!r} is not success, failure or cancelled")
        start, end = parse_when(since), None if until is None else parse_when(until)
        records = _reader(ledger).records(start, end, tenant)
    records = [r for r in records if wanted is None or r.status == wanted]
    if as_json:
        for r in records:
            sys.stdout.write(r.model_dump_json() + "\n")
        return
    if not records:
        console.print(f"no job ended in the ledger since {since}"
                      + (f" for tenant {tenant}" if tenant else ""), markup=False)
        return
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for name in ("ended (UTC)", "job", "state", "worker", "GPU-s", "$", "reason"):
        table.add_column(name, justify="right" if name in ("GPU-s", "$") else "left",
                         overflow="fold")
    for r in records:
        table.add_row(_utc(r.finished_at), r.key, r.status, r.node, f"{r.gpu_seconds:.2f}",
                      f"{_usd(r):.4f}", r.reason)
    _wide(table_console).print(table)
    console.print(f"{len(records)} job(s)", markup=False)


def _wide(terminal: Console) -> Console:
    """``terminal`` on a terminal (cells fold to its width); anywhere else a console as wide
    as the longest row: piped, a reason or a worker's name is never cut or folded."""
    return terminal if terminal.is_terminal else Console(width=PIPED_WIDTH)


@jobs_app.command("show")
def show_job(
    job: Annotated[str, typer.Argument(metavar="JOB", help="job_id, or TENANT:JOB_ID")],
    tenant: Annotated[Optional[str], typer.Option(
        metavar="NAME", help="the tenant of a bare job_id (default: 'default')")] = None,
    since: Annotated[str, typer.Option(
        metavar="WHEN", help="look back this far: 30d, 2026-12-01, or 'all'")] = "30d",
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Every ledger record of one job (one per end): states with times, stage seconds, cost,
    output URIs, runs without a result."""
    with errors():
        owner, job_id = split_key(job, tenant)
        records = _reader(ledger).records(parse_when(since), None, owner, job_id)
    if not records:
        fail(f"job {job}: no record in the ledger since {since} (not ended yet, or ended "
             "earlier: try --since all)")
    if as_json:
        for r in records:
            sys.stdout.write(r.model_dump_json(indent=2) + "\n")
        return
    for r in records:
        _show(r)


def _show(r: LedgerRecord) -> None:
    lines = [f"{r.key}: {r.status}" + (f" ({r.error})" if r.error else ""),
             "  states: " + ", ".join(f"{s.state} {_utc(s.at)}" for s in r.states),
             f"  worker: {r.node}; retries {r.error_retries}, requeues {r.requeues}",
             f"  GPU-seconds {r.gpu_seconds:.2f}, ${_usd(r):.6f} direct",
             f"  output: {r.output_uri}/"]
    if r.result is not None:
        res, m = r.result, r.result.manifest
        stages = {k: v for k, v in res.timings.model_dump().items()
                  if k.endswith("_s") and v and k != "backpressure_s"}
        lines += ["  stages: " + ", ".join(f"{k[:-2]} {v:.2f} s" for k, v in stages.items()),
                  f"  video: {count(m.frames, 'frame')}, {m.width}x{m.height}, "
                  f"{count(len(m.segments), 'segment')}" + (" (reused)" if res.reused else "")
                  + (f", {NOISE_NOTE}" if res.random_weights else ""),
                  f"  manifest: {res.manifest_uri}"]
        lines += [f"  {name}: {uri}" for name, uri in (
            ("playlist", m.playlist_uri), ("full", m.full_uri), ("latents", m.latents_uri))
            if uri]
        if res.cost is not None:
            lines.append(f"  cost: {res.cost.summary()}")
    for h in r.held:
        lines.append(f"  run without a result: {h.status} {h.reason} on {h.node}, "
                     f"{h.gpu_seconds:.2f} GPU-s")
    console.print("\n".join(lines), markup=False, highlight=False)
