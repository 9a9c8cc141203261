"""The worker app whose pool processes spend ``FRAMEFLEET_TEST_START_S`` more seconds in their
warm-up (a stand-in for a slow one, or, far over the start timeout, for one that never ends).
Celery loads it with ``-A tests.worker.lifecycle.slow_start_worker``; everything else is the
real worker."""

from __future__ import annotations

import os
import time
from typing import Any

from worker.lifecycle import warmup
from worker.lifecycle.main import app

_warm_up = warmup.warm_up


def _slow_warm_up(*args: Any, **kwargs: Any) -> Any:
    time.sleep(float(os.environ.get("FRAMEFLEET_TEST_START_S", "0")))
    return _warm_up(*args, **kwargs)


warmup.warm_up = _slow_warm_up  # type: ignore[assignment]

__all__ = ["app"]
