"""The operator's command line, ``framefleet`` (typer + rich).

- ``app``: the typer app and the job commands (submit, status, wait, cancel);
- ``fleet``: the commands that run or inspect the fleet (worker, healthcheck, exporter,
  doctor, flower, demo);
- ``cost``: ``framefleet cost`` (reports and the price catalog);
- ``help``: help text a person can read; ``demo``, ``doctor``: what those commands do.

The CLI never imports ``worker``: ``framefleet worker`` hands the process over to the
worker's own entry point (``python -m worker``).
"""

from producer.cli.app import cli, main

__all__ = ["cli", "main"]
