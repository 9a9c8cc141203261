"""The worker app with a pattern decoder that raises a CUDA error (``torch.AcceleratorError``,
what PyTorch raises for an illegal address or a failed kernel) once: while the file named by
``FRAMEFLEET_TEST_DEVICE_ERROR`` exists, the first chunk of a job removes it and raises. Celery
loads it with ``-A tests.e2e.faulty_worker``; everything else is the real worker."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import torch

from worker.decoders import pattern
from worker.lifecycle.main import app

_stream = pattern.PatternDecoder.stream


def _faulty(self: pattern.PatternDecoder, latents: torch.Tensor) -> Iterator[torch.Tensor]:
    marker = os.environ.get("FRAMEFLEET_TEST_DEVICE_ERROR")
    for chunk in _stream(self, latents):
        if marker and Path(marker).exists():
            Path(marker).unlink()
            raise torch.AcceleratorError(
                "CUDA error: an illegal memory access was encountered (injected)")
        yield chunk


pattern.PatternDecoder.stream = _faulty  # type: ignore[method-assign]

__all__ = ["app"]
