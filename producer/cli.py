"""``framefleet``: submit, status, wait, cancel, worker, demo, doctor (typer + rich)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console

from producer.cli_cost import cost_app
from producer.errors import FramefleetError
from producer.ports import CPU_PORT_OFFSET, DEFAULT_EXPORTER_PORT, DEFAULT_METRICS_PORT
from producer.spec import (
    DecoderSpec,
    InputSpec,
    JobResult,
    JobSpec,
    OutputSpec,
    PipelineSpec,
    VideoSpec,
    parse_spec,
)

if TYPE_CHECKING:
    from producer.client import Client

cli = typer.Typer(help="framefleet: a GPU worker fleet for generative-video decoding.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
cli.add_typer(cost_app, name="cost")
console = Console(soft_wrap=True)
err = Console(stderr=True)


def _client() -> Client:
    # Imported when a command needs it: ``framefleet --help`` does not load Celery.
    from producer.client import Client

    return Client()


def _fail(e: Exception) -> None:
    err.print(f"[red]error:[/red] {e}")
    raise typer.Exit(1)


def print_result(result: JobResult) -> None:
    m = result.manifest
    console.print(f"[green]SUCCESS[/green] {m.job_id}: {m.frames} frames, "
                  f"{len(m.segments)} segments, {m.width}x{m.height}, "
                  f"wall {result.timings.wall_s:.2f} s")
    console.print(f"manifest: {result.manifest_uri}")
    if result.cost is not None:
        console.print(f"cost: ${result.cost.total_usd:.6f} "
                      f"(${result.cost.usd_per_video_minute:.5f} per video-minute)")


@cli.command()
def submit(
    input: Annotated[Optional[str], typer.Option(help="latents URI (s3:// or file://)")] = None,
    output: Annotated[Optional[str], typer.Option(help="output URI prefix")] = None,
    job_id: Annotated[Optional[str], typer.Option(help="idempotency key")] = None,
    tenant: str = "default",
    decoder: str = "wan2.1-vae",
    fps: float = 16.0,
    crf: int = 20,
    segment_frames: int = 48,
    mode: str = "async",
    priority: int = 5,
    spec: Annotated[Optional[Path], typer.Option(help="a JobSpec JSON file instead")] = None,
    wait: Annotated[bool, typer.Option(help="wait and show progress")] = False,
) -> None:
    """Submit one job; prints its job_id."""
    try:
        if spec is not None:
            job = parse_spec(spec.read_text())
        else:
            if input is None or output is None:
                raise typer.BadParameter("--input and --output are required without --spec")
            job = parse_spec(JobSpec(
                job_id=job_id or f"job-{time.strftime('%Y%m%d%H%M%S')}-{time.time_ns() % 10**6}",
                tenant=tenant, input=InputSpec(uri=input),
                decoder=DecoderSpec.model_validate({"name": decoder}),
                video=VideoSpec(fps=fps, crf=crf, segment_frames=segment_frames),
                output=OutputSpec(uri=output),
                pipeline=PipelineSpec.model_validate({"mode": mode}), priority=priority,
            ).model_dump(mode="json"))
        handle = _client().submit(job)
        console.print(job.job_id)
        if wait:
            print_result(handle.wait(progress=True))
    except (FramefleetError, ValueError) as e:
        _fail(e)


@cli.command()
def status(job_id: str) -> None:
    """State and progress of a job."""
    handle = _client().get(job_id)
    state = handle.status()
    progress = handle.progress()
    extra = f" {progress.text}" if progress else ""  # denoise 12/50, then 120/121 frames
    console.print(f"{job_id}: {state}{extra}")


@cli.command("wait")
def wait_cmd(job_id: str, timeout: Optional[float] = None,
             json_out: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Wait for a job with a progress bar; print its result."""
    try:
        result = _client().get(job_id).wait(timeout=timeout, progress=not json_out)
    except (FramefleetError, TimeoutError) as e:
        _fail(e)
    if json_out:
        sys.stdout.write(result.model_dump_json(indent=2) + "\n")
    else:
        print_result(result)


@cli.command()
def cancel(job_id: str) -> None:
    """Cancel a job: it stops between chunks and writes no manifest."""
    _client().cancel(job_id)
    console.print(f"cancel requested for {job_id}")


@cli.command()
def worker(
    gpus: Annotated[Optional[str], typer.Option(help="all | 0,2 | N (the first N)")] = None,
    cpu: Annotated[int, typer.Option(help="CPU workers to start")] = 0,
) -> None:
    """Start one pinned Celery worker per GPU (and/or CPU workers), supervised."""
    from producer.settings import get_settings
    from worker.launcher import launch

    if gpus is None and cpu == 0:
        gpus = "all"
    try:
        raise typer.Exit(launch(gpus, cpu, get_settings()))
    except ValueError as e:
        _fail(e)


@cli.command()
def demo(
    decoder: Annotated[str, typer.Option(help="wan2.1-vae | pattern")] = "wan2.1-vae",
    frames: int = 33,
    width: int = 96,
    height: int = 96,
    out: Path = Path("demo-out"),
) -> None:
    """Run one job on the embedded default (no Redis, no S3) and show where the MP4s are."""
    from producer.demo import run_demo

    if decoder not in ("wan2.1-vae", "pattern"):
        _fail(ValueError(f"--decoder: unknown decoder {decoder!r}"))
    result, wall = run_demo(decoder, frames, out, width, height)
    print_result(result)
    m = result.manifest
    for seg in m.segments:
        console.print(f"  {seg.uri}  frames {seg.first_frame}-{seg.first_frame + seg.frames - 1}")
    console.print(f"demo: {m.frames} frames, {len(m.segments)} segments, "
                  f"wall {wall:.1f} s ({decoder}, {m.width}x{m.height})")


@cli.command()
def healthcheck(timeout: float = 5.0) -> None:
    """Exit 0 when a worker on this host answers a Celery ping and every worker process on
    it has captured its warm-up sizes (``FRAMEFLEET_WARMUP_DECODER``)."""
    import socket

    from producer.settings import get_settings
    from worker.warmup import not_ready

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
    from producer.settings import get_settings
    from worker.ops.exporter import run_exporter

    s = get_settings()
    run_exporter(s.broker_url, s.exporter_port, cloudwatch, interval)


@cli.command()
def doctor(
    output: Annotated[Optional[str], typer.Option(help="s3://bucket/prefix to probe")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the checks as JSON")] = False,
) -> None:
    """Check this deployment's settings and services; exit 1 if any check FAILs."""
    from producer.doctor import exit_code, render, run_checks, to_json
    from producer.settings import get_settings

    checks = run_checks(get_settings(), output)
    sys.stdout.write((to_json(checks) if json_out else render(checks)) + "\n")
    raise typer.Exit(exit_code(checks))


@cli.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def flower(ctx: typer.Context) -> None:
    """Flower dashboard on the fleet's broker (``celery -A producer.dashboard flower``; extra
    arguments such as ``--port=5555`` are passed on)."""
    import os

    os.execvp(sys.executable, [sys.executable, "-m", "celery", "-A",
                               "producer.dashboard", "flower", *ctx.args])


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
