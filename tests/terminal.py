"""A child process that takes Ctrl-C as it would from a terminal.

A shell starts a background job (``cmd &`` without job control, as a CI runner or ``nohup``
may) with SIGINT ignored, and an ignored signal stays ignored across ``exec``: Python then
installs no KeyboardInterrupt handler, and a test that sends SIGINT waits for nothing. Tests
that send SIGINT start their child with this as ``preexec_fn``.
"""

from __future__ import annotations

import signal


def ctrl_c_as_from_a_terminal() -> None:
    """Runs in the child before ``exec``: SIGINT back to its default action."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
