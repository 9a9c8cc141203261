"""``framefleet cost``: cost reports from finished jobs (``cost_report``), and the price
catalog (``cost_prices``)."""

from __future__ import annotations

import typer

from producer.cli.cost_plot import PLOT_MISSING
from producer.cli.cost_prices import prices
from producer.cli.cost_read import parse_duration, read_held, read_results
from producer.cli.cost_report import report, stage_totals

cost_app = typer.Typer(
    help="Cost-to-serve: reports from finished jobs, and the price catalog.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
cost_app.command("report")(report)
cost_app.command("prices")(prices)

__all__ = ["PLOT_MISSING", "cost_app", "parse_duration", "read_held", "read_results",
           "stage_totals"]
