"""Where the CLI prints: stdout for answers, stderr for errors, one line each."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console
from rich.text import Text

console = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def fail(e: Exception | str, code: int = 1) -> NoReturn:
    """Print ``error: MESSAGE`` on one line (no markup, no wrapping) and exit with ``code``."""
    message = " ".join(str(e).split())
    err.print(Text.assemble(("error:", "red"), " ", message))
    raise typer.Exit(code)
