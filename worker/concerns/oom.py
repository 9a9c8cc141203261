"""The OOM fallback: a CUDA out-of-memory runs the job again at once with the smaller working
set (``tiled``: the decode in spatial tiles; for a generate job also the other resident models
evicted and the text encoder kept on the host).

A job that does not fit even so fails (retrying the same thing cannot help). The requeue does
not spend the retry budget.
"""

from __future__ import annotations

import logging

from producer.errors import DeviceOutOfMemory, FatalJobError
from worker.concerns.base import Concern, Failed, Outcome
from worker.concerns.retries import requeue

log = logging.getLogger(__name__)


class OomFallback(Concern):
    """``DeviceOutOfMemory`` → requeue with ``tiled=True``; when already tiled → FAILURE."""

    def on_error(self, error: BaseException) -> Outcome | None:
        if not isinstance(error, DeviceOutOfMemory):
            return None
        if self.run.tiled:
            return Failed(cause=error, error=FatalJobError(
                f"{error}; the smaller working set did not fit either"))
        log.warning("job %s: %s; retrying with tiled decode", self.run.spec.key, error)
        return requeue(self.run, error, kwargs={"tiled": True})
