"""The Celery task ``framefleet.decode_video``: thin. Parse, run, map errors to states.

- Fatal errors (bad spec, bad input, conflicts) → FAILURE at once, with the message; no retry.
- Retryable errors (S3 5xx/throttling, connection loss, CUDA OOM) → retry with exponential
  back-off up to ``FRAMEFLEET_RETRY_MAX``, then FAILURE.
- Cancellation → REVOKED, no manifest; the worker goes on to the next job.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery import Task
from celery.exceptions import Ignore
from celery.signals import worker_process_init

from producer.app import TASK_NAME, app
from producer.control import flags_for
from producer.errors import FatalJobError, JobCancelled, JobConflictError, RetryableError
from producer.settings import get_settings
from producer.spec import JobSpec, Progress, parse_spec
from worker.runner import DecoderCache, JobContext, default_decoders, run_job

log = logging.getLogger(__name__)
_decoders: DecoderCache | None = None


@worker_process_init.connect
def _init_process(**_: Any) -> None:
    """Runs in the pool child that executes tasks: the first place CUDA may be touched."""
    global _decoders
    _decoders = default_decoders()
    log.info("framefleet worker process ready on %s", _decoders.device)


def decoders() -> DecoderCache:
    global _decoders
    if _decoders is None:
        _decoders = default_decoders()
    return _decoders


def backoff(retries: int) -> float:
    s = get_settings()
    return float(min(s.retry_backoff_max_s, s.retry_backoff_s * (2**retries)))


class _Throttle:
    """Calls ``fn`` at most every ``period`` seconds (the last call always goes through)."""

    def __init__(self, period: float) -> None:
        self.period, self.last = period, 0.0

    def due(self, final: bool = False) -> bool:
        now = time.monotonic()
        if final or now - self.last >= self.period:
            self.last = now
            return True
        return False


def _cost_fn() -> Any:
    try:
        from producer.cost import cost_for_job
    except ImportError:  # the cost model is optional for the pipeline
        return None
    return cost_for_job


@app.task(bind=True, name=TASK_NAME, acks_late=True, reject_on_worker_lost=True)
def decode_video(self: Task, payload: Any) -> dict[str, Any]:
    spec: JobSpec = parse_spec(payload)
    flags = flags_for(app)
    digest = spec.digest()
    registered = flags.claim(spec.job_id, digest)
    if registered is not None and registered != digest:
        raise JobConflictError(f"job_id {spec.job_id!r} was already used by a different spec")
    settings = get_settings()
    cancel_every = _Throttle(settings.cancel_poll_s)
    progress_every = _Throttle(0.2)

    def progress(p: Progress) -> None:
        if progress_every.due(final=p.frames_done == p.frames_total):
            self.update_state(state="PROGRESS", meta=p.model_dump())

    def cancelled() -> bool:
        return cancel_every.due() and flags.cancelled(spec.job_id)

    ctx = JobContext(progress=progress, cancelled=cancelled, cost=_cost_fn(),
                     node=self.request.hostname, settings=settings)
    try:
        if flags.cancelled(spec.job_id):
            raise JobCancelled(f"job {spec.job_id} was cancelled before it started")
        result = run_job(spec, decoders(), ctx)
    except JobCancelled as e:
        log.info("%s", e)
        self.update_state(state="REVOKED", meta={"exc_type": "JobCancelled", "exc_message": str(e),
                                                "exc_module": "producer.errors"})
        raise Ignore() from e
    except RetryableError as e:
        retries = self.request.retries
        if retries >= settings.retry_max:
            raise
        log.warning("job %s: %s; retry %d in %.1f s", spec.job_id, e, retries + 1, backoff(retries))
        raise self.retry(exc=e, countdown=backoff(retries), max_retries=settings.retry_max) from e
    except FatalJobError:
        raise
    return result.model_dump(mode="json")
