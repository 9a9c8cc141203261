"""Where the CLI prints: stdout for answers, stderr for errors, one line each."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console
from rich.text import Text

#: Answers: a line is never wrapped (a URI stays whole, copy-paste safe).
console = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)
#: Reports: tables that fold their cells to the terminal's width (80 columns when piped).
tables = Console()


def fail(e: Exception | str, code: int = 1) -> NoReturn:
    """Print ``error: MESSAGE`` on one line (no markup, no wrapping) and exit with ``code``."""
    message = " ".join(str(e).split())
    err.print(Text.assemble(("error:", "red"), " ", message))
    raise typer.Exit(code)
