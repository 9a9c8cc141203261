"""The worker app with a pattern decoder paced to ``FRAMEFLEET_TEST_CHUNK_S`` per chunk and a
generate job's denoise to ``FRAMEFLEET_TEST_STEP_S`` per step: stand-ins for decode and denoise
time, so a job is still running while a test watches it (SSE, previews, a live player, a
cancel); the tiny model's steps take milliseconds, less than one read of the event stream.
Celery loads it with ``-A tests.e2e.paced_worker``; everything else is the real worker. Latents
starting with ``FAULT_VALUE`` fail inside the decoder with a raw ``RuntimeError``."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from worker.decoders import pattern
from worker.generate import job
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


_denoise = job.denoise


def _paced_denoise(pipe: Any, gen: Any, info: Any, positive: Any, negative: Any,
                   step: Callable[[int, int], None], *args: Any, **kwargs: Any) -> Any:
    pause = float(os.environ.get("FRAMEFLEET_TEST_STEP_S", "0"))

    def paced(done: int, total: int) -> None:
        time.sleep(pause)
        step(done, total)

    return _denoise(pipe, gen, info, positive, negative, paced, *args, **kwargs)


pattern.PatternDecoder.stream = _paced  # type: ignore[method-assign]
job.denoise = _paced_denoise

__all__ = ["app"]
