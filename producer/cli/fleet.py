"""The commands that run or inspect the fleet: worker, demo, healthcheck, exporter, doctor,
flower. ``producer.cli.app`` registers them on the ``framefleet`` command."""

from __future__ import annotations

import json
import os
import re
import socket
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from producer.cli.output import console, count, err, errors, fail, note
from producer.ports import CPU_PORT_OFFSET, DEFAULT_EXPORTER_PORT, DEFAULT_METRICS_PORT
from producer.wire.spec import JobResult
from producer.wire.weights import NOISE_NOTE

#: ``--gpus``: all, a count, or a comma-separated list of indices.
GPUS_RE = re.compile(r"^(all|[0-9]+|[0-9]+(,[0-9]+)+)$")


def worker(
    gpus: Annotated[Optional[str], typer.Option(help="all | 0,2 | N (the first N)")] = None,
    cpu: Annotated[int, typer.Option(help="CPU workers to start")] = 0,
) -> None:
    """Start one pinned Celery worker per GPU (and/or CPU workers), supervised.

    Runs the worker's own entry point, ``python -m worker``, in this process: the worker
    package (torch, diffusers) is needed on this host."""
    if gpus is not None and not GPUS_RE.fullmatch(gpus.replace(" ", "")):
        fail(f"--gpus: {gpus!r} is not 'all', a count such as 2, or GPU indices such as 0,2")
    if cpu < 0:
        fail(f"--cpu: {cpu} is not a count of CPU workers (0 or more)")
    argv = [sys.executable, "-m", "worker", "--cpu", str(cpu)]
    if gpus is not None:
        argv += ["--gpus", gpus.replace(" ", "")]
    os.execvp(sys.executable, argv)


def demo(
    decoder: Annotated[str, typer.Option(
        metavar="NAME", help="wan2.1-vae (random weights: noise) | pattern")] = "wan2.1-vae",
    frames: Annotated[int, typer.Option(
        metavar="N", help="video frames: 4k+1 (1, 5, 9, …: one latent frame makes the first, "
        "each next one four)")] = 33,
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
    from producer.cli.common import print_result
    from producer.cli.demo import run_demo

    if decoder not in ("wan2.1-vae", "pattern"):
        fail(f"--decoder: unknown decoder {decoder!r} (wan2.1-vae or pattern)")
    if frames < 1 or (frames - 1) % 4:
        below = max(1, frames - (frames - 1) % 4) if frames >= 1 else 1
        fail(f"--frames: {frames} is not 4k+1 (the decoder makes 1 frame from the first latent "
             f"frame and 4 from each next one): use {below} or {below + 4}")
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
    with errors():
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
    console.print(demo_line(result, wall, "tiny random Wan pipeline" if generate else decoder),
                  markup=False)


def demo_line(result: JobResult, wall: float, what: str) -> str:
    """The demo's last line. Two times, each named: the SUCCESS line's wall is the job's run
    on the worker; ``wall`` is the demo's own wait, from submit to result: the worker's start
    (it boots meanwhile), its taking the job, the run, and the result's storing."""
    m = result.manifest
    noise = f", {NOISE_NOTE}" if result.random_weights else ""
    return (f"demo: {count(m.frames, 'frame')}, {count(len(m.segments), 'segment')}, "
            f"{wall:.1f} s from submit to result with the worker's start, of which the run "
            f"on the worker (the wall above) {result.timings.wall_s:.2f} s "
            f"({what}, {m.width}x{m.height}{noise})")


def healthcheck(
    timeout: Annotated[float, typer.Option(metavar="SECONDS", help="how long to wait for "
                                           "an answer")] = 5.0,
) -> None:
    """Exit 0 when a worker on this host answers a Celery ping and every worker process on
    it has captured its warm-up sizes (``FRAMEFLEET_WARMUP_DECODER``)."""
    import socket

    from producer.cli.common import _client
    from producer.settings import get_settings
    from producer.state.readiness import not_ready

    with errors():
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


def fleet(
    json_out: Annotated[bool, typer.Option("--json", help="print the states as JSON")] = False,
    all_brokers: Annotated[bool, typer.Option(
        "--all", help="also the worker processes of other brokers on this host, each row "
        "labelled with its broker")] = False,
) -> None:
    """This host's worker processes of this broker (FRAMEFLEET_BROKER_URL), by Celery node
    name (``gpu0@host``, as Flower and the cost report name them): ready or warming up, and
    where each one's start went (seconds from process start: imports, init, read, cast_move,
    prepare, compile_cache, warmup, total; the same as framefleet_worker_start_seconds).
    Another fleet's on the same host (another broker) are counted, and listed with --all."""
    from dataclasses import asdict

    from producer.client.connection import address
    from producer.settings import get_settings
    from producer.state.readiness import live_states, state_dir

    with errors():
        settings = get_settings()
        states = live_states(state_dir(settings))
    ours = address(settings.broker_url)
    shown = states if all_brokers else [s for s in states if s.broker == ours]
    if json_out:
        sys.stdout.write(json.dumps([asdict(s) for s in shown], indent=2) + "\n")
        return
    # Which host and which broker this answer is about: a new terminal without
    # FRAMEFLEET_BROKER_URL talks to another broker than the workers may.
    console.print(f"host {socket.gethostname()}, broker {broker_address(settings.broker_url)}",
                  markup=False)
    if not shown:
        console.print("no worker process of this broker has started on this host", markup=False)
    for s in shown:
        label = "" if not all_brokers else f", broker {s.broker or 'not recorded'}"
        console.print(_process_line(s) + label, markup=False)
    others = sorted({s.broker or "not recorded" for s in states if s.broker != ours})
    if others and not all_brokers:
        n = len(states) - len(shown)
        note(f"{n} worker process{'' if n == 1 else 'es'} of other brokers on this host "
             f"({', '.join(others)}): framefleet fleet --all lists them", "note")


def _process_line(s: Any) -> str:
    """``worker process PID (NODE): ready 12.3 s after its start (phases…)``."""
    phases = ", ".join(f"{k} {v:.1f} s" for k, v in s.phases.items() if k != "total")
    total = s.phases.get("total")
    node = f" ({s.node})" if s.node else ""
    head = f"worker process {s.pid}{node}: {'ready' if s.ready else 'warming up'}"
    if total is not None:
        head += f" {total:.1f} s after its start"
    return head + (f" ({phases})" if phases else "")


def broker_address(url: str) -> str:
    """``url`` without its password or path: scheme://host:port (``filesystem://`` as is)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if not parts.hostname:
        return f"{parts.scheme}://"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname}{port}"


EXPORTER_HELP = (
    "Fleet-wide Prometheus exporter of the Redis queue (one per fleet): depth, age of the "
    "oldest waiting job, undecodable messages.\n\n"
    f"Serves /metrics on FRAMEFLEET_EXPORTER_PORT (default {DEFAULT_EXPORTER_PORT}). Workers "
    f"serve theirs on FRAMEFLEET_METRICS_PORT (default {DEFAULT_METRICS_PORT}) + GPU index, "
    f"CPU workers on FRAMEFLEET_METRICS_PORT + {CPU_PORT_OFFSET} + slot."
)


def exporter(
    cloudwatch: Annotated[bool, typer.Option(help="also put QueueDepth to CloudWatch")] = False,
    interval: Annotated[float, typer.Option(help="seconds between two reads")] = 15.0,
) -> None:
    import signal
    import threading

    from producer.ops.exporter import run_exporter
    from producer.settings import get_settings

    s = get_settings()
    # SIGTERM (docker stop, Kubernetes, systemd) ends the loop: the server is shut down and the
    # process exits 0, instead of dying by the signal (143).
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    run_exporter(s.broker_url, s.exporter_port, cloudwatch, interval, stop=stop)


def doctor(
    output: Annotated[Optional[str], typer.Option(help="s3://bucket/prefix to probe")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the checks as JSON")] = False,
) -> None:
    """Check this deployment's settings and services (live workers among them); exit 1 if
    any check FAILs. A development Redis without an append-only file FAILs the persistence
    check: right for production, expected on a laptop (see the README)."""
    from producer.cli.doctor import exit_code, render, run_checks, to_json
    from producer.settings import get_settings

    with errors():
        checks = run_checks(get_settings(), output)
    sys.stdout.write((to_json(checks) if json_out else render(checks)) + "\n")
    raise typer.Exit(exit_code(checks))


def flower(ctx: typer.Context) -> None:
    """Flower dashboard on the fleet's broker: celery -A producer.ops.dashboard flower, with any
    extra arguments (such as --port=5555) passed on. Listens on 127.0.0.1 unless given
    --address, and asks for FRAMEFLEET_FLOWER_BASIC_AUTH (user:password) when set."""
    from producer.settings import get_settings

    with errors():
        settings = get_settings()
    env = dict(os.environ)
    args = list(ctx.args)
    if not any(a == "--address" or a.startswith("--address=") for a in args):
        args.append("--address=127.0.0.1")  # Flower's own default is every interface
    if settings.flower_basic_auth is not None:
        # In the environment, not on the command line: `ps` shows a command line to anyone.
        env["FLOWER_BASIC_AUTH"] = settings.flower_basic_auth.get_secret_value()
    address = next((a.split("=", 1)[1] if "=" in a else args[i + 1] if i + 1 < len(args) else ""
                    for i, a in enumerate(args) if a.split("=", 1)[0] == "--address"), "")
    if "FLOWER_BASIC_AUTH" not in env and address not in ("127.0.0.1", "::1", "localhost"):
        note(f"Flower listens on {address or 'all interfaces'} without a login: anyone who "
             "reaches it can revoke jobs and stop workers; set FRAMEFLEET_FLOWER_BASIC_AUTH")
    os.execvpe(sys.executable, [sys.executable, "-m", "celery", "-A", "producer.ops.dashboard",
                                "flower", *args], env)
