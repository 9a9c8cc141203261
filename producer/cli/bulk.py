"""``framefleet submit --from FILE``: many jobs from a JSON Lines file, a JobSpec per line.

The specs go through ``Client.submit_many``: each keeps every guarantee of a single submit
(the checks, the claim of its job_id, the same spec submitted again is the same job). stdout
gets the key of every job queued (or found: the same spec submitted before), one per line, in
the file's order, so ``framefleet submit --from jobs.jsonl > keys.txt`` keeps them; stderr gets
a progress bar on a terminal, one ``error: line N …`` per line refused (a line that is no
JobSpec, or one the fleet's rules refuse, or a job_id reused with another spec), then a
summary. Exit status 0 when every line was queued, 1 when any was refused (the others are
queued all the same), 69 when the broker stopped answering (the summary says how far it got).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.text import Text

from producer.cli.common import _client, broker_name
from producer.cli.output import EXIT_ERROR, console, count, err, exit_code, fail, note
from producer.errors import BrokerError
from producer.wire.rules import LocalPathWarning
from producer.wire.spec import JobSpec, parse_spec

#: Distinct warnings printed (a thousand jobs on one local path would repeat one a thousand
#: times); the count of the others follows.
MAX_WARNINGS = 5


def read_specs(path: Path) -> tuple[list[tuple[int, JobSpec]], list[tuple[int, str]]]:
    """The file's specs with their line numbers, and its lines that are no JobSpec, with why.
    Blank lines are skipped."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        fail(f"--from: cannot read {path}: {getattr(e, 'strerror', None) or e}")
    specs, bad = [], []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            specs.append((number, parse_spec(line)))
        except ValueError as e:  # InvalidJobError names every bad field
            bad.append((number, " ".join(str(e).split())))
    if not specs and not bad:
        fail(f"--from: {path} holds no JobSpec (one JSON object per line)")
    return specs, bad


@contextmanager
def _bar(total: int) -> Iterator[Any]:
    """A bar on stderr when it is a terminal (stdout carries the keys); else nothing."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    screen = Console(stderr=True)
    progress = Progress("submitting", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=screen, disable=not screen.is_terminal, transient=True)
    task = progress.add_task("submit", total=total)
    with progress:
        yield lambda done: progress.update(task, completed=done)


def submit_file(path: Path) -> None:
    """Submit every JobSpec of ``path``; see the module's docstring."""
    specs, refused = read_specs(path)
    total = len(specs) + len(refused)  # every line that held something
    client = _client()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LocalPathWarning)
        with _bar(len(specs)) as done:
            outcomes = client.submit_many([spec for _, spec in specs], done)
    queued, stopped = 0, None
    for (number, spec), outcome in zip(specs, outcomes, strict=True):
        if outcome.ok:
            queued += 1
            console.print(spec.key, markup=False)
        elif isinstance(outcome.error, BrokerError):
            stopped = stopped or (number, outcome.error)
        else:
            refused.append((number, f"{spec.key}: {' '.join(str(outcome.error).split())}"))
    for number, message in sorted(refused):
        err.print(Text.assemble(("error:", "red"), f" line {number}: {message}"))
    _warnings([str(w.message) for w in caught if issubclass(w.category, LocalPathWarning)])
    note(f"queued {queued:,} of {count(total, 'job')} from {path} on the broker at "
         f"{broker_name(client)}" + (f"; {count(len(refused), 'line')} refused (above)"
                                     if refused else ""), "note")
    if stopped is not None:
        number, e = stopped
        fail(f"{e}: line {number} and every line after it were not queued", exit_code(e))
    if refused:
        raise typer.Exit(EXIT_ERROR)


def _warnings(messages: list[str]) -> None:
    distinct = list(dict.fromkeys(messages))
    for message in distinct[:MAX_WARNINGS]:
        note(message)
    if len(distinct) > MAX_WARNINGS:
        note(f"and {len(distinct) - MAX_WARNINGS} more like them")
