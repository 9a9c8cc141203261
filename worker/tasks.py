"""The Celery task ``framefleet.decode_video``: thin. Parse, run, map errors to states.

- Fatal errors (bad spec, bad input, conflicts) → FAILURE at once, with the message; no retry.
- Retryable errors (S3 5xx/throttling, connection loss, CUDA OOM) → retry with exponential
  back-off up to ``FRAMEFLEET_RETRY_MAX``, then FAILURE.
- Cancellation → REVOKED, no manifest; the worker goes on to the next job.
- Spot interruption notice → the worker stops consuming, its running job stops between chunks
  and goes back to the queue (a Celery retry with no delay) for another worker.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from celery import Task
from celery.exceptions import Ignore
from celery.signals import worker_process_init, worker_ready, worker_shutdown

from producer.app import QUEUE, TASK_NAME, app
from producer.control import flags_for
from producer.cost import configured_prices, cost_for_job
from producer.errors import (
    DeviceOutOfMemory,
    FatalJobError,
    FramefleetError,
    InvalidJobError,
    JobCancelled,
    JobConflictError,
    RetryableError,
)
from producer.settings import get_settings
from producer.spec import DecoderSpec, JobSpec, Progress, parse_spec
from worker import metrics
from worker.lease import LEASE_RETRY_S, REDIS_DOWN, JobLease
from worker.runner import DecoderCache, JobContext, default_decoders, run_job
from worker.spot import SpotWatcher

log = logging.getLogger(__name__)
_decoders: DecoderCache | None = None


@worker_process_init.connect
def _init_process(**_: Any) -> None:
    """Runs in the pool child that executes tasks: the first place CUDA may be touched.

    The /metrics server and the NVML sampler live here too, in the process that runs jobs
    (prometheus_client's registry is per process). A broken pricing file fails here, loudly.
    """
    global _decoders
    settings = get_settings()
    _decoders = default_decoders(settings)
    try:
        port = metrics.start_metrics_server(settings.metrics_port)
    except OSError as e:  # a taken port must not keep a GPU from working
        log.error("metrics server on port %s not started: %s", settings.metrics_port, e)
        port = 0
    metrics.set_gpu_price(configured_prices())
    if settings.warmup_decoder is not None:
        # Weights loaded and kernels warmed before the first job, not during it.
        h, w = (int(v) for v in settings.warmup_latent_size.split("x"))
        decoder = _decoders.get(DecoderSpec(name=settings.warmup_decoder))
        t0 = time.perf_counter()
        decoder.warmup(h, w)
        log.info("warmed up %s at %dx%d latents in %.1f s", decoder.name, h, w,
                 time.perf_counter() - t0)
    if settings.warmup_model is not None:
        from worker.generate.job import warm_up

        try:  # a bad folder fails the jobs that name it, with the reason; not the worker
            entry = warm_up(_decoders.models, settings.warmup_model)
            log.info("model %s resident (%.1f GiB) after %.1f s", entry.folder,
                     entry.bytes / 2**30, entry.load_s)
        except FramefleetError as e:
            log.error("FRAMEFLEET_WARMUP_MODEL not loaded: %s", e)
    if _decoders.device.type == "cuda":
        metrics.NvmlSampler().start()
    log.info("framefleet worker process ready on %s (metrics port %s)", _decoders.device, port)


_watcher: SpotWatcher | None = None


@worker_ready.connect
def _start_spot_watcher(sender: Any = None, **_: Any) -> None:
    """In the worker's main process: on a spot notice, stop consuming and flag the node so
    its running job (in the pool child) stops between chunks and is requeued."""
    global _watcher
    settings = get_settings()
    if not settings.spot_watch or sender is None:
        return
    node = sender.hostname

    def on_notice(notice: dict[str, Any]) -> None:
        app.control.cancel_consumer(QUEUE, destination=[node])
        flags_for(app).set_preempted(node)
        log.warning("%s: spot notice %s: stopped consuming, handing back its job", node, notice)

    _watcher = SpotWatcher(settings.imds_url, settings.spot_poll_s, on_notice)
    _watcher.start()


@worker_shutdown.connect
def _stop_spot_watcher(**_: Any) -> None:
    if _watcher is not None:
        _watcher.stop()


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


@app.task(bind=True, name=TASK_NAME, acks_late=True, reject_on_worker_lost=True)
def decode_video(self: Task, payload: Any, tiled: bool = False) -> dict[str, Any]:
    limit = get_settings().max_message_bytes
    size = len(json.dumps(payload))
    if size > limit:
        raise InvalidJobError(f"job message is {size} bytes, over the {limit} byte limit")
    spec: JobSpec = parse_spec(payload)
    flags = flags_for(app)
    digest = spec.digest()
    registered = flags.claim(spec.job_id, digest)
    if registered is not None and registered != digest:
        raise JobConflictError(f"job_id {spec.job_id!r} was already used by a different spec")
    if _succeeded(spec.job_id, digest):
        # A duplicate delivery (kombu restores unacked messages after a lost connection).
        log.warning("job %s already succeeded: duplicate delivery dropped", spec.job_id)
        raise Ignore()
    lease = JobLease(getattr(app.backend, "client", None), spec.job_id,
                     str(self.request.hostname))
    if not lease.acquire():
        # Another worker runs this job right now: look again later instead of running twice.
        raise self.retry(countdown=LEASE_RETRY_S, max_retries=self.request.retries + 1)
    try:
        return _run(self, spec, digest, tiled, flags)
    finally:
        lease.release()


def _succeeded(job_id: str, digest: str) -> bool:
    meta = app.backend.get_task_meta(job_id)
    result = meta.get("result")
    return (meta.get("status") == "SUCCESS" and isinstance(result, dict)
            and result.get("spec_digest") == digest)


def _run(self: Task, spec: JobSpec, digest: str, tiled: bool, flags: Any) -> dict[str, Any]:
    settings = get_settings()
    cancel_every = _Throttle(settings.cancel_poll_s)
    progress_every = _Throttle(0.2)

    def progress(p: Progress) -> None:
        if progress_every.due(final=p.frames_done == p.frames_total):
            try:
                self.update_state(state="PROGRESS", meta=p.model_dump())
            except REDIS_DOWN as e:  # progress is best effort: Redis away is no failed job
                log.warning("job %s: progress not stored: %s", spec.job_id, e)

    node = str(self.request.hostname)
    preempted = False

    def cancelled() -> bool:
        nonlocal preempted
        if not cancel_every.due():
            return False
        try:
            preempted = flags.preempted(node)
            return preempted or flags.cancelled(spec.job_id)
        except REDIS_DOWN as e:  # read again at the next poll
            log.warning("job %s: cancel flags not read: %s", spec.job_id, e)
            return False

    ctx = JobContext(progress=progress, cancelled=cancelled, cost=cost_for_job,
                     node=self.request.hostname, tiled=tiled, settings=settings)
    try:
        if flags.cancelled(spec.job_id):
            raise JobCancelled(f"job {spec.job_id} was cancelled before it started")
        result = run_job(spec, decoders(), ctx)
    except JobCancelled as e:
        if preempted:
            # Back to the queue at once for another worker (this one no longer consumes);
            # a requeue is not a failure, so it does not count against retry_max.
            log.warning("job %s handed back: node %s is being reclaimed", spec.job_id, node)
            metrics.observe_job("retry", spec.tenant, None)
            raise self.retry(exc=e, countdown=0, max_retries=self.request.retries + 1) from e
        log.info("%s", e)
        metrics.observe_job("cancelled", spec.tenant, None)
        self.update_state(state="REVOKED", meta={"exc_type": "JobCancelled", "exc_message": str(e),
                                                "exc_module": "producer.errors"})
        raise Ignore() from e
    except DeviceOutOfMemory as e:
        if tiled:
            metrics.observe_job("failure", spec.tenant, None)
            raise FatalJobError(f"{e}; the smaller working set did not fit either") from e
        # Once more at once, with the smaller working set (spatial tiles).
        log.warning("job %s: %s; retrying with tiled decode", spec.job_id, e)
        metrics.observe_job("retry", spec.tenant, None)
        raise self.retry(exc=e, countdown=0, kwargs={"tiled": True},
                         max_retries=self.request.retries + 1) from e
    except RetryableError as e:
        retries = self.request.retries
        if retries >= settings.retry_max:
            metrics.observe_job("failure", spec.tenant, None)
            raise
        metrics.observe_job("retry", spec.tenant, None)
        log.warning("job %s: %s; retry %d in %.1f s", spec.job_id, e, retries + 1, backoff(retries))
        raise self.retry(exc=e, countdown=backoff(retries), max_retries=settings.retry_max) from e
    except BaseException:
        metrics.observe_job("failure", spec.tenant, None)
        raise
    metrics.observe_job("success", spec.tenant, result)
    return result.model_dump(mode="json")
