"""``framefleet``: the typer app and the job commands (submit, status, wait, cancel), with the
fleet's commands (``producer.cli.fleet``), ``jobs`` and ``cost`` registered on it.

Errors are one line on stderr (``error: …``) and an exit status that says what happened
(``producer.cli.output``: 1 an error, 3 the job failed, 4 it was cancelled, 69 the broker does
not answer, 124 ``wait`` ran out of time, 130 Ctrl-C); never a traceback for a condition the
user can fix.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.text import Text

from producer.cli import fleet
from producer.cli.cost import cost_app
from producer.cli.help import plain_typer
from producer.cli.jobs import jobs_app
from producer.cli.output import EXIT_INTERRUPTED, EXIT_TIMEOUT, console, err, fail, note
from producer.cli.output import errors as _errors
from producer.client.jobstate import FINISHED
from producer.errors import FramefleetError
from producer.spec import JobResult, parse_spec

if TYPE_CHECKING:
    from producer.client import Client, JobHandle

cli = plain_typer(help="framefleet, a GPU worker fleet for generative-video inference.",
                  rich_markup_mode="markdown",
                  no_args_is_help=True, pretty_exceptions_enable=False)
cli.add_typer(cost_app, name="cost")
cli.add_typer(jobs_app, name="jobs")
#: ``wait``'s default limit, in seconds (``--timeout 0``: none).
WAIT_TIMEOUT_S = 3600.0
__all__ = ["EXIT_TIMEOUT", "WAIT_TIMEOUT_S", "cli", "main", "print_result"]


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


def _client() -> Client:
    # Imported when a command needs it: ``framefleet --help`` does not load Celery.
    from producer.client import Client

    return Client()


def _uri(value: Optional[str]) -> Optional[str]:
    """A URI as given, or a plain local path as its absolute ``file://`` URI."""
    if value is None or "://" in value or value == "random":
        return value
    return Path(value).expanduser().absolute().as_uri()


def print_result(result: JobResult) -> None:
    m = result.manifest
    console.print(f"[green]SUCCESS[/green] {m.job_id}: {m.frames} frames, "
                  f"{len(m.segments)} segments, {m.width}x{m.height}, "
                  f"wall {result.timings.wall_s:.2f} s")
    console.print(f"manifest: {result.manifest_uri}", markup=False)
    if result.random_weights:
        console.print('[yellow]random weights[/yellow] (decoder.weights "random"): the '
                      "frames are noise, not a model's video")
    if result.cost is not None:
        console.print(f"cost: {result.cost.summary()}", markup=False)


JobIdArg = Annotated[str, typer.Argument(
    metavar="JOB", help="the job: its job_id, or TENANT:JOB_ID (what submit prints)")]
TenantOpt = Annotated[Optional[str], typer.Option(
    metavar="NAME", help="the tenant of a bare job_id (default: 'default')")]
TimeoutOpt = Annotated[float, typer.Option(
    metavar="SECONDS", help="give up after this long (exit status 124); 0: no limit")]
EXITS = ("Exit status: 0 succeeded, 1 an error (unknown job, bad setting), 3 the job failed, "
         "4 it was cancelled, 69 the broker or result backend does not answer (after "
         "FRAMEFLEET_WAIT_OUTAGE_S), 124 still running after the timeout, 130 interrupted "
         "(the job goes on).")


def _say(line: str) -> None:
    note(line, "note")


def _wait(handle: JobHandle, timeout: float, progress: bool) -> JobResult:
    """``handle.wait`` with its notes on stderr; Ctrl-C says the job goes on (exit 130)."""
    try:
        with _errors():
            return handle.wait(timeout=timeout or None, progress=progress,
                               say=None if progress else _say)
    except KeyboardInterrupt:
        fail(f"interrupted: job {handle.key} goes on without you (framefleet wait "
             f"{handle.key} follows it again; framefleet cancel {handle.key} stops it)",
             EXIT_INTERRUPTED)


@cli.command()
def submit(
    input: Annotated[Optional[str], typer.Option(
        metavar="URI", help="latents (.safetensors or .npy): s3://bucket/key, file:///path, "
        "or a local path (a path on the workers)")] = None,
    output: Annotated[Optional[str], typer.Option(
        metavar="URI", help="output prefix: s3://bucket/prefix, file:///path or a local "
        "folder; the job writes under PREFIX/TENANT/JOB_ID/")] = None,
    weights: Annotated[Optional[str], typer.Option(
        metavar="DIR", help="the decoder's weights: a diffusers-layout folder on the workers "
        "(config.json + diffusion_pytorch_model.safetensors; a path or file:// URI), or "
        "'random' (seeded random weights: the video is noise). Required by the Wan "
        "decoders")] = None,
    job_id: Annotated[Optional[str], typer.Option(
        metavar="ID", help="idempotency key (default: job-TIMESTAMP-N)")] = None,
    tenant: Annotated[str, typer.Option(metavar="NAME", help="tenant (cost reports)")]
    = "default",
    decoder: Annotated[str, typer.Option(
        metavar="NAME", help="wan2.1-vae | wan2.2-vae | pattern")] = "wan2.1-vae",
    fps: Annotated[Optional[float], typer.Option(
        metavar="FPS", help="frames per second (default: the decoder's model's: 24 for "
        "wan2.2-vae, else 16)")] = None,
    crf: Annotated[int, typer.Option(metavar="N", help="x264 quality, 0-51")] = 20,
    segment_frames: Annotated[int, typer.Option(metavar="N", help="frames per MP4 segment")]
    = 48,
    mode: Annotated[str, typer.Option(metavar="MODE", help="async | sequential")] = "async",
    priority: Annotated[int, typer.Option(metavar="N", help="0-9, 9 the most urgent")] = 5,
    spec: Annotated[Optional[Path], typer.Option(
        metavar="FILE", help="a JobSpec JSON file, instead of the options above")] = None,
    wait: Annotated[bool, typer.Option(
        "--wait", help="wait for the job with a progress bar, then print its result (exit "
        "status as for wait)")] = False,
    timeout: TimeoutOpt = WAIT_TIMEOUT_S,
) -> None:
    """Submit one job; print its key (its job_id, as TENANT:JOB_ID for a tenant other than
    'default')."""
    with _errors():
        if spec is not None:
            try:
                text = spec.read_text()
            except OSError as e:
                fail(f"--spec: cannot read {spec}: {e.strerror or e}")
            job = parse_spec(text)
        else:
            if input is None or output is None:
                fail("--input and --output are required without --spec")
            dec: dict[str, Any] = {"name": decoder}
            if weights is not None:
                dec["weights"] = _uri(weights)
            job = parse_spec({
                "job_id": job_id or f"job-{time.strftime('%Y%m%d%H%M%S')}-"
                                    f"{time.time_ns() % 10**6}",
                "tenant": tenant, "input": {"uri": _uri(input)}, "decoder": dec,
                "video": {"crf": crf, "segment_frames": segment_frames,
                          **({"fps": fps} if fps is not None else {})},
                "output": {"uri": _uri(output)}, "pipeline": {"mode": mode},
                "priority": priority,
            })
        handle = _client().submit(job)
    console.print(job.key, markup=False)  # what status, wait and cancel take
    if wait:
        print_result(_wait(handle, timeout, progress=True))


@cli.command()
def status(job_id: JobIdArg, tenant: TenantOpt = None) -> None:
    """Print a job's state: UNKNOWN (exit status 1), QUEUED, STARTED, PROGRESS, RETRY,
    SUCCESS, FAILURE or REVOKED, with the stage and the worker, or the reason. A job queued
    while no worker takes jobs gets a line saying when one last did and how many are alive."""
    with _errors():
        handle = _client().get(job_id, tenant)
        js = handle.state()
        idle = handle.idle() if js.state == "QUEUED" else None
    detail = js.detail()
    console.print(f"{job_id}: {js.state}" + (f" ({detail})" if detail else ""),
                  markup=False, highlight=False)
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
        state = _client().cancel(job_id, tenant)
    if state in FINISHED:
        console.print(f"{job_id}: already {state}; nothing to cancel", markup=False)
    else:
        console.print(f"cancel requested for {job_id} (was {state}): it stops between chunks "
                      "and ends REVOKED", markup=False)


_EXTRA = {"allow_extra_args": True, "ignore_unknown_options": True}
cli.command(context_settings=_EXTRA)(fleet.worker)
cli.command()(fleet.demo)
cli.command()(fleet.healthcheck)
cli.command(help=fleet.EXPORTER_HELP)(fleet.exporter)


@cli.command()
def api() -> None:
    """HTTP gateway: /v1/videos (the OpenAI Videos shape), /v1/jobs with Server-Sent Events,
    and a page at / to watch jobs. Listens on FRAMEFLEET_API_ADDR:FRAMEFLEET_API_PORT
    (127.0.0.1:8080 unless set); needs FRAMEFLEET_API_KEYS_FILE, FRAMEFLEET_API_MODELS_FILE
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
