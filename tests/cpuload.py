"""Busy cores for tests that must hold on a loaded machine: ``busy_cores()`` starts one
spinning Python process per core (bounded in time: each exits by itself after ``limit_s``) and
kills them, by PID, when the block ends."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

_SPIN = ("import time, sys\n"
         "end = time.monotonic() + float(sys.argv[1])\n"
         "while time.monotonic() < end: pass\n")


@contextmanager
def busy_cores(count: int | None = None, limit_s: float = 600.0) -> Iterator[list[int]]:
    """``count`` spinning processes (default: one per core) for at most ``limit_s`` seconds;
    yields their PIDs."""
    n = count if count is not None else (os.cpu_count() or 2)
    procs = [subprocess.Popen([sys.executable, "-c", _SPIN, str(limit_s)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for _ in range(n)]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(timeout=10)
