"""What the ``framefleet`` commands share: the client, the error line, URIs from paths, the
result's summary."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from producer.cli.output import console, fail
from producer.errors import FramefleetError
from producer.spec import JobResult, job_key

if TYPE_CHECKING:
    from producer.client import Client

#: ``wait``'s default limit, in seconds (``--timeout 0``: none).
WAIT_TIMEOUT_S = 3600.0
#: The exit status of a ``wait`` that ran out of time (as timeout(1)'s).
EXIT_TIMEOUT = 124


def _client() -> Client:
    # Imported when a command needs it: ``framefleet --help`` does not load Celery.
    from producer.client import Client

    return Client()


@contextmanager
def _errors() -> Iterator[None]:
    """The command's expected failures become one ``error:`` line and exit status 1."""
    try:
        yield
    except FramefleetError as e:
        fail(e)
    except TimeoutError as e:
        fail(e, EXIT_TIMEOUT)
    except ValueError as e:
        fail(e)


def _uri(value: Optional[str]) -> Optional[str]:
    """A URI as given, or a plain local path as its absolute ``file://`` URI."""
    if value is None or "://" in value or value == "random":
        return value
    return Path(value).expanduser().absolute().as_uri()


def print_result(result: JobResult) -> None:
    m = result.manifest
    key = job_key(m.tenant, m.job_id)  # what status, wait and cancel take
    console.print(f"[green]SUCCESS[/green] {key}: {m.frames} frames, "
                  f"{len(m.segments)} segments, {m.width}x{m.height}, "
                  f"wall {result.timings.wall_s:.2f} s")
    console.print(f"manifest: {result.manifest_uri}", markup=False)
    if result.random_weights:
        console.print('[yellow]random weights[/yellow] (decoder.weights "random"): the '
                      "frames are noise, not a model's video")
    facts = m.generate
    if facts is not None:
        extra = "".join([f", image {facts.image.sha256[:12]}" if facts.image else "",
                         *(f", LoRA {lo.sha256[:12]} x{lo.scale:g}" for lo in facts.loras)])
        console.print(f"generate: tier {facts.tier}, cache {facts.cache}, {facts.steps} steps"
                      f"{extra}", markup=False)
    if result.cost is not None:
        console.print(f"cost: ${result.cost.total_usd:.6f} "
                      f"(${result.cost.usd_per_video_minute:.5f} per video-minute)")


JobIdArg = Annotated[str, typer.Argument(
    metavar="JOB", help="the job: its job_id, or TENANT:JOB_ID (what submit prints)")]
TenantOpt = Annotated[Optional[str], typer.Option(
    metavar="NAME", help="the tenant of a bare job_id (default: 'default')")]
TimeoutOpt = Annotated[float, typer.Option(
    metavar="SECONDS", help="give up after this long (exit status 124); 0: no limit")]


def _wait(handle: Any, timeout: float, progress: bool) -> JobResult:
    result: JobResult = handle.wait(timeout=timeout or None, progress=progress)
    return result
