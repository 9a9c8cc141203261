"""The warm-up model's weight files streamed into the page cache from a process's first moments.

A new host's start waits, above all, for its disk: 34 GB of the 5B folder at about 2.3 GB/s
on the measured H100 host. The worker's own read (``worker.generate.model.fastload``) can only
start once Python, torch and diffusers are imported and the device is up, seconds after the
process started. So the process starts a few threads first thing, which read every weight file
of ``FRAMEFLEET_WARMUP_MODEL`` (the VAE's first, as the load wants it) into the page cache, as
``cat`` would, and drop what they read; the load then finds its bytes in memory, or in flight.
With a warm page cache the reads are memory copies, done in a moment.

Reads are of regular files only (a link is read where it points, as the load will: a hub
download's snapshot links into its blobs), in the operator's warm-up folder (like the warm-up
load itself, it is not confined to the job's file roots), and a file that cannot be read is
skipped: the load that follows reads it again and names what is wrong. Nothing read is kept or
shown. No torch here: the worker's entry point starts this before its heavy imports.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

log = logging.getLogger(__name__)
CHUNK = 64 * 1024**2  # bytes one task reads (in reads of BUFFER)
BUFFER = 8 * 1024**2


def weight_files(folder: Path) -> list[Path]:
    """The folder's ``*/*.safetensors`` files (links resolved, each once), the VAE's first,
    then the biggest first."""
    found: dict[str, Path] = {}
    for path in folder.glob("*/*.safetensors"):
        found.setdefault(os.path.realpath(path), path)
    return sorted((Path(real) for real in found),
                  key=lambda p: (found[str(p)].parent.name != "vae", -_size(p)))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


class Readahead:
    """Threads that read files into the page cache; ``join`` waits for them."""

    def __init__(self, files: list[Path], threads: int) -> None:
        self.files = files
        self.start = time.time()
        self.end: float | None = None
        self.bytes = 0
        self._tasks = [(f, off) for f in files for off in range(0, _size(f), CHUNK)]
        self._lock = threading.Lock()
        self._left = len(self._tasks)
        self._threads = [threading.Thread(target=self._run, name=f"readahead-{i}", daemon=True)
                         for i in range(max(1, min(threads, len(self._tasks))))]
        for t in self._threads:
            t.start()

    def _next(self) -> tuple[Path, int] | None:
        with self._lock:
            return self._tasks.pop(0) if self._tasks else None

    def _run(self) -> None:
        buffer = bytearray(BUFFER)
        while (task := self._next()) is not None:
            path, offset = task
            got = _read(path, offset, buffer)
            with self._lock:
                self.bytes += got
                self._left -= 1
                if not self._left:
                    self.end = time.time()
                    log.info("readahead: %d files, %.2f GB in the page cache in %.1f s",
                             len(self.files), self.bytes / 1e9, self.end - self.start)

    def join(self, timeout: float | None = None) -> tuple[float, float] | None:
        """Wait for the reads; their span (epoch seconds), or None if they did not end."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self._threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return (self.start, self.end) if self.end is not None else None


def _read(path: Path, offset: int, buffer: bytearray) -> int:
    """Read ``CHUNK`` bytes of ``path`` from ``offset`` (fewer at its end), dropped."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return 0
        done, view = 0, memoryview(buffer)
        while done < CHUNK:
            n = os.preadv(fd, [view[:min(BUFFER, CHUNK - done)]], offset + done)
            if n <= 0:
                break
            done += n
        return done
    except OSError:
        return 0
    finally:
        os.close(fd)


def begin(folder: str | Path | None, threads: int) -> Readahead | None:
    """Start reading ``folder``'s weight files into the page cache; None without a folder or
    a file to read."""
    if not folder:
        return None
    text = str(folder)
    if text.startswith("file://"):
        text = unquote(urlparse(text).path)
    files = weight_files(Path(text).expanduser())
    return Readahead(files, threads) if files else None


def begin_from_settings(settings: Callable[[], Any]) -> Readahead | None:
    """``begin`` for ``FRAMEFLEET_WARMUP_MODEL`` with ``FRAMEFLEET_LOAD_THREADS`` threads, as
    ``settings()`` (``producer.settings.get_settings``) gives them; None where the settings
    are not readable (the worker's start names that itself, a moment later)."""
    try:
        current = settings()
    except Exception:  # noqa: BLE001 - bad settings are the start's to report, not this
        return None
    return begin(current.warmup_model, current.load_threads)
