"""``framefleet``: the typer app and the job commands (submit, status, wait, cancel), with the
fleet's commands (``producer.cli.fleet``), ``jobs`` and ``cost`` registered on it.

Errors are one line on stderr (``error: …``) and an exit status that says what happened
(``producer.cli.output``: 1 an error, 3 the job failed, 4 it was cancelled, 69 the broker does
not answer, 124 ``wait`` ran out of time, 130 Ctrl-C); never a traceback for a condition the
user can fix.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.text import Text

from producer.cli import fleet
from producer.cli.common import (
    EXIT_TIMEOUT,
    EXITS,
    WAIT_TIMEOUT_S,
    JobIdArg,
    TenantOpt,
    TimeoutOpt,
    _client,
    _errors,
    _uri,
    _wait,
    broker_name,
    print_result,
)
from producer.cli.compile import compile as compile_model
from producer.cli.cost import cost_app
from producer.cli.help import plain_typer
from producer.cli.jobs import jobs_app
from producer.cli.models import models_app
from producer.cli.output import console, err, fail, note
from producer.cli.submit import submit
from producer.client.jobstate import FINISHED
from producer.errors import FramefleetError

cli = plain_typer(help="framefleet, a GPU worker fleet for generative-video inference.",
                  rich_markup_mode="markdown",
                  no_args_is_help=True, pretty_exceptions_enable=False)
cli.add_typer(cost_app, name="cost")
cli.add_typer(jobs_app, name="jobs")
cli.add_typer(models_app, name="models")
cli.command()(submit)
cli.command(name="compile")(compile_model)
__all__ = ["EXIT_TIMEOUT", "WAIT_TIMEOUT_S", "_uri", "cli", "main", "print_result"]


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            console.print(f"framefleet {version('framefleet')}")
        except PackageNotFoundError:
            console.print("framefleet (not installed)")
        raise typer.Exit()


@cli.callback()
def _main(
    version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="Print the version and exit.",
    )] = False,
) -> None:
    """framefleet, a GPU worker fleet for generative-video inference."""


@cli.command()
def status(job_id: JobIdArg, tenant: TenantOpt = None) -> None:
    """Print a job's state: UNKNOWN (exit status 1), QUEUED, STARTED, PROGRESS, RETRY,
    SUCCESS, FAILURE or REVOKED, with the stage and the worker, or the reason. A job queued
    while no worker takes jobs gets a line saying when one last did and how many are alive."""
    with _errors():
        client = _client()
        handle = client.get(job_id, tenant)
        js = handle.state()
        idle = handle.idle() if js.state == "QUEUED" else None
    broker = broker_name(client)
    if js.state == "UNKNOWN":  # the broker it asked: a new terminal may ask another one
        line = (f"{job_id}: UNKNOWN (no such job on {broker}: never submitted, or its record "
                "expired; FRAMEFLEET_BROKER_URL names the broker)")
    else:
        detail = js.detail()
        line = f"{job_id}: {js.state}" + (f" ({detail})" if detail else "") + f", broker {broker}"
    console.print(line, markup=False, highlight=False)
    if js.progress is not None and js.progress.warning:
        note(js.progress.warning)
    if idle is not None:
        note(idle.text(), "hint")
    if js.state == "UNKNOWN":
        raise typer.Exit(1)


@cli.command("wait", epilog=EXITS)
def wait_cmd(
    job_id: JobIdArg,
    tenant: TenantOpt = None,
    timeout: TimeoutOpt = WAIT_TIMEOUT_S,
    json_out: Annotated[bool, typer.Option(
        "--json", help="print the JobResult as JSON (no progress bar)")] = False,
) -> None:
    """Wait for a job, with a progress bar showing its state; print its result.

    Rides out a broker or result backend that stops answering for up to
    FRAMEFLEET_WAIT_OUTAGE_S (120 s) and says so on one line."""
    with _errors():
        handle = _client().get(job_id, tenant)
    result = _wait(handle, timeout, progress=not json_out)
    if json_out:
        sys.stdout.write(result.model_dump_json(indent=2) + "\n")
    else:
        print_result(result)


@cli.command()
def cancel(job_id: JobIdArg, tenant: TenantOpt = None) -> None:
    """Cancel a job: it stops between chunks, writes no manifest and ends REVOKED.

    Refused for an id that was never submitted. Submitting the same spec again after a
    cancel runs it again."""
    with _errors():
        client = _client()
        state = client.cancel(job_id, tenant)
    broker = broker_name(client)
    if state in FINISHED:
        console.print(f"{job_id}: already {state} on {broker}; nothing to cancel", markup=False)
    else:
        console.print(f"cancel requested for {job_id} (was {state}) on {broker}: it stops "
                      "between chunks and ends REVOKED", markup=False)


_EXTRA = {"allow_extra_args": True, "ignore_unknown_options": True}
cli.command(context_settings=_EXTRA)(fleet.worker)
cli.command()(fleet.demo)
cli.command()(fleet.healthcheck)
cli.command(name="fleet")(fleet.fleet)
cli.command(help=fleet.EXPORTER_HELP)(fleet.exporter)


@cli.command()
def api() -> None:
    """HTTP gateway: /v1/videos (the OpenAI Videos shape), /v1/jobs with Server-Sent Events,
    and a page at / to watch jobs. Listens on FRAMEFLEET_API_ADDR:FRAMEFLEET_API_PORT
    (127.0.0.1:8000 unless set); needs FRAMEFLEET_API_KEYS_FILE, FRAMEFLEET_API_MODELS_FILE
    and an s3:// FRAMEFLEET_OUTPUT_PREFIX, and the api extra (pip install 'framefleet[api]')."""
    from producer.settings import get_settings

    try:
        from producer.api.serve import serve
    except ImportError as e:
        fail(f"framefleet api needs the api extra (pip install 'framefleet[api]'): {e}")
    with _errors():
        serve(get_settings())


cli.command()(fleet.doctor)
cli.command(context_settings=_EXTRA)(fleet.flower)


def main() -> None:
    try:
        cli()
    except FramefleetError as e:  # from a command that does not catch its own (one line still)
        err.print(Text.assemble(("error:", "red"), " ", " ".join(str(e).split())))
        sys.exit(1)


if __name__ == "__main__":
    main()
