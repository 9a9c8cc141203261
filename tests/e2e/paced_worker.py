"""The worker app with a pattern decoder paced to ``FRAMEFLEET_TEST_CHUNK_S`` per chunk: a
stand-in for decode time, so a job is still running while a test watches it (SSE, a live
player, a cancel). Celery loads it with ``-A tests.e2e.paced_worker``; everything else is the
real worker. Latents starting with ``FAULT_VALUE`` fail inside the decoder with a raw
``RuntimeError``."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import torch

from worker.decoders import pattern
from worker.lifecycle.main import app

_stream = pattern.PatternDecoder.stream
#: Latents that start with this value make the decoder raise a raw exception, as a bug inside
#: a model would (the gateway's tests show what a client reads of one).
FAULT_VALUE = 13.0


def _paced(self: pattern.PatternDecoder, latents: torch.Tensor) -> Iterator[torch.Tensor]:
    if latents.numel() and float(latents.flatten()[0]) == FAULT_VALUE:
        raise RuntimeError("shape '[1, 45, 1, -1]' is invalid for input of size 4321")
    pause = float(os.environ.get("FRAMEFLEET_TEST_CHUNK_S", "0"))
    for chunk in _stream(self, latents):
        time.sleep(pause)
        yield chunk


pattern.PatternDecoder.stream = _paced  # type: ignore[method-assign]

__all__ = ["app"]
