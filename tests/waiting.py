"""Bounded polling for the tests that watch a fleet: one helper, so every wait has a limit and
fails naming what it waited for."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(check: Callable[[], T | None], timeout: float, what: str, interval: float = 0.05,
             detail: Callable[[], str] = lambda: "") -> T:
    """Poll ``check()`` until it returns something truthy and return it; after ``timeout`` s
    fail naming ``what``, with ``detail()`` (a log tail, say)."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:.0f} s. {detail()}".rstrip())
        time.sleep(interval)
