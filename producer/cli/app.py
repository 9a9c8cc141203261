"""``framefleet``: submit, status, wait, cancel, worker, demo, doctor, api (typer + rich).

Errors are one line on stderr (``error: …``) and a non-zero exit status: 1 for an error,
124 for ``wait`` running out of time; never a traceback for a condition the user can fix.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.text import Text

from producer.cli.common import (
    EXIT_TIMEOUT,
    WAIT_TIMEOUT_S,
    JobIdArg,
    TenantOpt,
    TimeoutOpt,
    _client,
    _errors,
    _uri,
    _wait,
    print_result,
)
from producer.cli.cost import cost_app
from producer.cli.help import plain_typer
from producer.cli.models import models_app
from producer.cli.output import console, err, fail
from producer.cli.submit import submit
from producer.client.jobstate import FINISHED
from producer.errors import FramefleetError
from producer.ports import CPU_PORT_OFFSET, DEFAULT_EXPORTER_PORT, DEFAULT_METRICS_PORT

cli = plain_typer(help="framefleet, a GPU worker fleet for generative-video inference.",
                  rich_markup_mode="markdown",
                  no_args_is_help=True, pretty_exceptions_enable=False)
cli.add_typer(cost_app, name="cost")
cli.add_typer(models_app, name="models")
cli.command()(submit)
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
    SUCCESS, FAILURE or REVOKED, with the frames done, the worker or the reason."""
    with _errors():
        js = _client().state(job_id, tenant)
    detail = js.detail()
    console.print(f"{job_id}: {js.state}" + (f" ({detail})" if detail else ""),
                  markup=False, highlight=False)
    if js.state == "UNKNOWN":
        raise typer.Exit(1)


@cli.command("wait")
def wait_cmd(
    job_id: JobIdArg,
    tenant: TenantOpt = None,
    timeout: TimeoutOpt = WAIT_TIMEOUT_S,
    json_out: Annotated[bool, typer.Option(
        "--json", help="print the JobResult as JSON (no progress bar)")] = False,
) -> None:
    """Wait for a job, with a progress bar showing its state; print its result.

    Exit status 0 when it succeeded, 1 when it failed, was cancelled or is unknown, 124 when
    it is still running after the timeout."""
    with _errors():
        result = _wait(_client().get(job_id, tenant), timeout, progress=not json_out)
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


@cli.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def worker(
    gpus: Annotated[Optional[str], typer.Option(help="all | 0,2 | N (the first N)")] = None,
    cpu: Annotated[int, typer.Option(help="CPU workers to start")] = 0,
) -> None:
    """Start one pinned Celery worker per GPU (and/or CPU workers), supervised.

    Runs the worker's own entry point, ``python -m worker``, in this process: the worker
    package (torch, diffusers) is needed on this host."""
    import os

    argv = [sys.executable, "-m", "worker", "--cpu", str(cpu)]
    if gpus is not None:
        argv += ["--gpus", gpus]
    os.execvp(sys.executable, argv)


@cli.command()
def demo(
    decoder: Annotated[str, typer.Option(
        metavar="NAME", help="wan2.1-vae (random weights: noise) | pattern")] = "wan2.1-vae",
    frames: Annotated[int, typer.Option(metavar="N", help="video frames")] = 33,
    width: Annotated[int, typer.Option(metavar="PIXELS")] = 96,
    height: Annotated[int, typer.Option(metavar="PIXELS")] = 96,
    out: Annotated[Path, typer.Option(metavar="DIR", help="where the videos go")]
    = Path("demo-out"),
    generate: Annotated[bool, typer.Option(
        "--generate", help="a prompt job on a tiny random Wan pipeline (denoise + decode)")]
    = False,
    image: Annotated[Optional[Path], typer.Option(
        metavar="FILE", help="with --generate: an image-to-video job from this PNG/JPEG/WebP")]
    = None,
    steps: Annotated[int, typer.Option(metavar="N", help="--generate: denoise steps")] = 4,
) -> None:
    """Run one job on the embedded default (no Redis, no S3) and show where the MP4s are.

    The Wan decoder runs with random weights: the demo shows the fleet, not a model, so its
    frames are noise. ``--generate`` (and ``--image``) runs a prompt (image) job on a tiny
    random Wan pipeline, whose video is noise too."""
    from producer.cli.demo import run_demo

    if decoder not in ("wan2.1-vae", "pattern"):
        fail(f"--decoder: unknown decoder {decoder!r} (wan2.1-vae or pattern)")
    if image is not None and not generate:
        fail("--image: only with --generate")
    if image is not None and not image.is_file():
        fail(f"--image: no such file: {image}")
    if generate:
        console.print("demo: a prompt job on a tiny random Wan pipeline (random weights): the "
                      "video is noise; real videos need a model folder (see the README)",
                      markup=False)
    elif decoder != "pattern":
        console.print('demo: random weights (decoder.weights "random"): the frames are noise; '
                      "real videos need a weights folder (see the README)", markup=False)
    with _errors():
        try:
            result, wall = run_demo(decoder, frames, out, width, height, generate=generate,
                                    image=image, steps=steps)
        except RuntimeError as e:
            fail(e)
    print_result(result)
    m = result.manifest
    for seg in m.segments:
        console.print(f"  {seg.uri}  frames {seg.first_frame}-{seg.first_frame + seg.frames - 1}",
                      markup=False)
    what = ("tiny random Wan pipeline" if generate else decoder
            + (", random weights" if result.random_weights else ""))
    console.print(f"demo: {m.frames} frames, {len(m.segments)} segments, "
                  f"wall {wall:.1f} s ({what}, {m.width}x{m.height})")


@cli.command()
def healthcheck(
    timeout: Annotated[float, typer.Option(metavar="SECONDS", help="how long to wait for "
                                           "an answer")] = 5.0,
) -> None:
    """Exit 0 when a worker on this host answers a Celery ping and every worker process on
    it has captured its warm-up sizes (``FRAMEFLEET_WARMUP_DECODER``)."""
    import socket

    from producer.readiness import not_ready
    from producer.settings import get_settings

    with _errors():
        replies = _client().ping(timeout=timeout)
    host = socket.gethostname()
    names = [name for reply in replies for name in reply]
    if not any(name.endswith(f"@{host}") for name in names):
        err.print(f"no worker on {host} answered (answers: {json.dumps(names)})")
        raise typer.Exit(1)
    waiting = not_ready(get_settings())
    if waiting:
        err.print("not ready: " + "; ".join(waiting))
        raise typer.Exit(1)
    console.print("ok")


EXPORTER_HELP = (
    "Fleet-wide Prometheus exporter of the Redis queue (one per fleet): depth, age of the "
    "oldest waiting job, undecodable messages.\n\n"
    f"Serves /metrics on FRAMEFLEET_EXPORTER_PORT (default {DEFAULT_EXPORTER_PORT}). Workers "
    f"serve theirs on FRAMEFLEET_METRICS_PORT (default {DEFAULT_METRICS_PORT}) + GPU index, "
    f"CPU workers on FRAMEFLEET_METRICS_PORT + {CPU_PORT_OFFSET} + slot."
)


@cli.command(help=EXPORTER_HELP)
def exporter(
    cloudwatch: Annotated[bool, typer.Option(help="also put QueueDepth to CloudWatch")] = False,
    interval: Annotated[float, typer.Option(help="seconds between two reads")] = 15.0,
) -> None:
    from producer.ops.exporter import run_exporter
    from producer.settings import get_settings

    s = get_settings()
    run_exporter(s.broker_url, s.exporter_port, cloudwatch, interval)


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


@cli.command()
def doctor(
    output: Annotated[Optional[str], typer.Option(help="s3://bucket/prefix to probe")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the checks as JSON")] = False,
) -> None:
    """Check this deployment's settings and services; exit 1 if any check FAILs."""
    from producer.cli.doctor import exit_code, render, run_checks, to_json
    from producer.settings import get_settings

    checks = run_checks(get_settings(), output)
    sys.stdout.write((to_json(checks) if json_out else render(checks)) + "\n")
    raise typer.Exit(exit_code(checks))


@cli.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def flower(ctx: typer.Context) -> None:
    """Flower dashboard on the fleet's broker: celery -A producer.ops.dashboard flower, with any
    extra arguments (such as --port=5555) passed on."""
    import os

    os.execvp(sys.executable, [sys.executable, "-m", "celery", "-A",
                               "producer.ops.dashboard", "flower", *ctx.args])


def main() -> None:
    try:
        cli()
    except FramefleetError as e:  # from a command that does not catch its own (one line still)
        err.print(Text.assemble(("error:", "red"), " ", " ".join(str(e).split())))
        sys.exit(1)


if __name__ == "__main__":
    main()
