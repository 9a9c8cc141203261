"""The worker app with a pattern decoder that hangs: while the file named by
``FRAMEFLEET_TEST_HANG`` exists, a job's third chunk waits for ever on an event nothing sets (as
a deadlocked lock or a device call that never returns would), after two chunks of progress.
Celery loads it with ``-A tests.e2e.stuck_worker`` (``FRAMEFLEET_TEST_APP``); everything else is
the real worker, its stuck-job watchdog included."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import torch

from worker.decoders import pattern
from worker.lifecycle.main import app

_stream = pattern.PatternDecoder.stream


def _hang_forever() -> None:
    threading.Event().wait()


def _hanging(self: pattern.PatternDecoder, latents: torch.Tensor) -> Iterator[torch.Tensor]:
    marker = os.environ.get("FRAMEFLEET_TEST_HANG")
    for n, chunk in enumerate(_stream(self, latents)):
        if n == 2 and marker and Path(marker).exists():
            _hang_forever()
        yield chunk


pattern.PatternDecoder.stream = _hanging  # type: ignore[method-assign]

__all__ = ["app"]
