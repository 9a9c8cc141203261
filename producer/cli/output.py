"""Where the CLI prints (stdout for answers, stderr for errors, one line each) and the exit
statuses it ends with."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NoReturn

import typer
from rich.console import Console
from rich.text import Text

from producer.errors import BrokerUnavailable, FramefleetError, JobCancelled, JobFailed
from producer.wire.rules import LocalPathWarning

#: Answers: a line is never wrapped (a URI stays whole, copy-paste safe).
console = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)
#: Reports: tables that fold their cells to the terminal's width (80 columns when piped).
tables = Console()

#: Exit statuses (the README lists them). 2 is click's, for a command line it cannot parse.
EXIT_ERROR = 1  # a bad spec, setting or argument; an unknown job; a refused password
EXIT_FAILED = 3  # the job ended in FAILURE
EXIT_CANCELLED = 4  # the job ended REVOKED (cancelled)
EXIT_UNAVAILABLE = 69  # the broker or result backend does not answer (sysexits' EX_UNAVAILABLE)
EXIT_TIMEOUT = 124  # `wait` ran out of time, the job goes on (as timeout(1)'s)
EXIT_INTERRUPTED = 130  # Ctrl-C on `wait`: the job goes on (128 + SIGINT)
#: How long after Ctrl-C a command inside ``ctrl_c_exits`` may take to get there itself.
CTRL_C_GRACE_S = 3.0


def count(n: int, noun: str) -> str:
    """``1 segment``, ``2 segments``, ``0 segments``."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def fail(e: Exception | str, code: int = EXIT_ERROR) -> NoReturn:
    """Print ``error: MESSAGE`` on one line (no markup, no wrapping) and exit with ``code``."""
    message = " ".join(str(e).split())
    err.print(Text.assemble(("error:", "red"), " ", message))
    raise typer.Exit(code)


def note(message: str, label: str = "warning") -> None:
    """One ``warning: …`` (or other ``label``) line on stderr."""
    err.print(Text.assemble((f"{label}:", "yellow"), " ", " ".join(message.split())))


def exit_code(e: BaseException) -> int:
    """The exit status an error ends a command with."""
    if isinstance(e, JobFailed):
        return EXIT_FAILED
    if isinstance(e, JobCancelled):
        return EXIT_CANCELLED
    if isinstance(e, BrokerUnavailable):
        return EXIT_UNAVAILABLE
    if isinstance(e, TimeoutError):
        return EXIT_TIMEOUT
    return EXIT_ERROR


@contextmanager
def errors(words: Callable[[str], str] | None = None) -> Iterator[None]:
    """The command's expected failures become one ``error:`` line and their exit status;
    when it succeeds, warnings raised inside (a local path only the workers can judge) become
    ``warning:`` lines. ``words`` rewrites both (``producer.cli.flags.as_flags``: the flags a
    user typed for the fields they set)."""
    say = words or str
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LocalPathWarning)
        try:
            yield
        except (FramefleetError, TimeoutError, ValueError) as e:
            # one line: a warning about what did not happen is moot
            fail(say(" ".join(str(e).split())), exit_code(e))
        _warn(caught, say)


def _warn(caught: list[warnings.WarningMessage], say: Callable[[str], str] = str) -> None:
    for w in caught:
        if issubclass(w.category, LocalPathWarning):
            note(say(str(w.message)))
    caught.clear()


def exit_now(message: str, code: int) -> NoReturn:
    """``error: MESSAGE`` straight to stderr's file descriptor, then end the process at once.

    For an interrupt: it may have landed anywhere (inside a rich print, whose buffer then
    holds the line for good; inside Redis or kombu code, whose objects' finalizers run at a
    normal exit), so neither rich nor the interpreter's shutdown is trusted with the end."""
    os.write(2, ("error: " + " ".join(message.split()) + "\n").encode())
    os._exit(code)


@contextmanager
def ctrl_c_exits(message: str) -> Iterator[None]:
    """Inside: Ctrl-C ends the process with ``error: MESSAGE`` and ``EXIT_INTERRUPTED``.

    The command catches ``KeyboardInterrupt`` and calls ``exit_now`` itself; should it not
    get there within ``CTRL_C_GRACE_S`` (a call that does not see the interrupt, such as a
    name lookup, or a library that swallows it), a watchdog thread woken by the signal
    (``signal.set_wakeup_fd``) ends the process instead. Main thread only."""
    read, write = os.pipe()
    os.set_blocking(write, False)
    previous = signal.set_wakeup_fd(write)

    def watch() -> None:
        try:
            while (byte := os.read(read, 1)) and byte[0] != signal.SIGINT:
                continue  # another signal (a terminal resize, a child): keep watching
            if byte:
                time.sleep(CTRL_C_GRACE_S)
                if sys.stdout.isatty():
                    os.write(1, b"\x1b[?25h\n")  # a bar's hidden cursor
                exit_now(message, EXIT_INTERRUPTED)
        finally:
            os.close(read)

    threading.Thread(target=watch, name="ctrl-c", daemon=True).start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous)
        os.close(write)  # the watchdog reads the end of its pipe and stops
