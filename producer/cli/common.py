"""What the ``framefleet`` commands share: the client, the error line and exit statuses, URIs
from paths, the result's summary, the wait (its notes, Ctrl-C)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from producer.cli.output import (
    EXIT_INTERRUPTED,
    EXIT_TIMEOUT,
    console,
    count,
    ctrl_c_exits,
    errors,
    exit_now,
    note,
)
from producer.wire.spec import JobResult, job_key
from producer.wire.weights import NOISE_NOTE

if TYPE_CHECKING:
    from producer.client import Client

__all__ = ["EXITS", "EXIT_TIMEOUT", "WAIT_TIMEOUT_S", "JobIdArg", "TenantOpt", "TimeoutOpt",
           "_client", "_errors", "_uri", "_wait", "broker_name", "print_result"]
#: ``wait``'s default limit, in seconds (``--timeout 0``: none).
WAIT_TIMEOUT_S = 3600.0
#: The command's expected failures: one ``error:`` line and the exit status of its kind
#: (``producer.cli.output``: 3 failed, 4 cancelled, 69 broker unreachable, 124 timed out).
_errors = errors


def _client() -> Client:
    # Imported when a command needs it: ``framefleet --help`` does not load Celery.
    from producer.client import Client

    return Client()


def broker_name(client: Any) -> str:
    """The broker a client (or a job's handle) asks, as ``host:port``, no password."""
    from producer.client.handle import broker_of

    return broker_of(client.app)


def _uri(value: Optional[str]) -> Optional[str]:
    """A URI as given, or a plain local path as its absolute ``file://`` URI."""
    if value is None or "://" in value or value == "random":
        return value
    return Path(value).expanduser().absolute().as_uri()


def random_weights_why(result: JobResult) -> str:
    """Why the job's weights were random: its decoder asked, or its model folder says so."""
    if result.manifest.generate is not None and result.manifest.generate.random_weights:
        return ("generate.model is a folder of random weights (framefleet models tiny): the "
                "video is noise, not a model's")
    return 'decoder.weights "random": the frames are noise, not a model\'s video'


def print_result(result: JobResult) -> None:
    m = result.manifest
    key = job_key(m.tenant, m.job_id)  # what status, wait and cancel take
    noise = f", [yellow]{NOISE_NOTE}[/yellow]" if result.random_weights else ""
    console.print(f"[green]SUCCESS[/green] {key}: {count(m.frames, 'frame')}, "
                  f"{count(len(m.segments), 'segment')}, {m.width}x{m.height}, "
                  f"wall {result.timings.wall_s:.2f} s{noise}")
    console.print(f"manifest: {result.manifest_uri}", markup=False)
    if result.random_weights:
        console.print(f"{NOISE_NOTE} ({random_weights_why(result)})", markup=False)
    facts = m.generate
    if facts is not None:
        extra = "".join([f", image {facts.image.sha256[:12]}" if facts.image else "",
                         *(f", LoRA {lo.sha256[:12]} x{lo.scale:g}" for lo in facts.loras)])
        console.print(f"generate: tier {facts.tier}, cache {facts.cache}, {facts.steps} steps"
                      f"{extra}", markup=False)
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


def _wait(handle: Any, timeout: float, progress: bool,
          words: Callable[[str], str] | None = None) -> JobResult:
    """``handle.wait`` with its notes on stderr (above the bar when there is one); Ctrl-C
    says the job goes on and exits 130 at once, wherever it landed (``ctrl_c_exits``).
    ``words``: as ``errors``'s (a failure of a job built from options names its flags)."""
    gone = (f"interrupted: job {handle.key} goes on without you (framefleet wait "
            f"{handle.key} follows it again; framefleet cancel {handle.key} stops it)")
    with ctrl_c_exits(gone):
        try:
            with _errors(words):
                result: JobResult = handle.wait(timeout=timeout or None, progress=progress,
                                                say=None if progress else _say)
                return result
        except KeyboardInterrupt:  # the bar is closed: unwinding got here
            exit_now(gone, EXIT_INTERRUPTED)
