"""Metrics: every run's end is counted, with its reason, and the device time it held.

- An ended job (success, failure, cancelled) → ``framefleet_jobs_total{status,reason,tenant}``;
  a run that sends its job back (retry, requeue) → ``framefleet_job_retries_total``; a
  success's timings, output and cost too (``worker.metrics.observe_job``).
- Every run → ``framefleet_gpu_held_seconds_total{status}``; a run without a JobResult also
  leaves a :class:`~producer.wire.spec.HeldRun` record in Redis, so ``framefleet cost report`` can
  show the GPU time that failed, retried and cancelled runs were paid for.
- A job's first delivery → ``framefleet_queue_wait_seconds``: from the client's enqueue stamp
  (the ``framefleet_enqueued_at`` message header, unix time) to the start of the run. Later
  deliveries carry the same stamp; their wait would include earlier runs and back-offs.
- A job that fails before it runs (its spec does not parse, its ``job_id`` was used by another
  spec) is counted by :func:`failed_before_run`, which the task calls.

The ``tenant`` label is capped by ``FRAMEFLEET_METRICS_TENANTS`` (others: ``other``).
"""

from __future__ import annotations

import logging
import secrets
import sys
import time
from typing import Any

import redis
from celery import Task

from producer.app import ENQUEUED_AT_HEADER
from producer.cost import configured_prices
from producer.errors import FramefleetError
from producer.settings import Settings
from producer.state import keys
from producer.wire.spec import HeldRun, JobSpec, job_key
from worker import labels, metrics
from worker.concerns.base import Concern, Outcome
from worker.concerns.endmark import EndMark
from worker.concerns.lease import run_lease
from worker.concerns.retries import Requeue
from worker.run.run import Run

log = logging.getLogger(__name__)


def enqueued_at(request: Any) -> float | None:
    """The enqueue stamp of a task request (Celery puts custom headers on the request and
    in ``request.headers``); None when the message has none or it is not a number."""
    value = getattr(request, ENQUEUED_AT_HEADER, None)
    if value is None:
        value = (getattr(request, "headers", None) or {}).get(ENQUEUED_AT_HEADER)
    return as_stamp(value)


def as_stamp(value: Any) -> float | None:
    """An enqueue stamp as sent (a header's value), or None when it is not a number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def failed_before_run(error: BaseException, spec: JobSpec | None, settings: Settings) -> None:
    """Count a job that failed before it ran (bad spec, reused ``job_id``): an end like any
    other. Without a parsed spec its tenant is not known: ``unknown``."""
    tenant = (labels.UNKNOWN_TENANT if spec is None
              else labels.tenant_label(spec.tenant, settings.metrics_tenant_names))
    try:
        metrics.observe_job("failure", tenant, None, reason=labels.failure_reason(error))
    except Exception:  # counting must never change how the task ends
        log.exception("could not count the failed job")


class JobMetrics(Concern):
    """Counts the run's end and its held time; observes the queue wait of a first delivery."""

    sees_fenced = True  # the device time a zombie held is counted

    def __init__(self, run: Run, task: Task) -> None:
        super().__init__(run, task)
        # Created with every concern, before any runs: the run's start, even if a concern
        # ahead of this one ends it in before_run (a job cancelled while queued).
        self.started_at = time.time()
        self.started = time.monotonic()
        self.tenant = labels.tenant_label(run.spec.tenant, run.settings.metrics_tenant_names)
        request = task.request
        stamp = enqueued_at(request)
        if stamp is not None and not request.retries and not _redelivered(request):
            metrics.observe_queue_wait(self.tenant, self.started_at - stamp)

    def on_outcome(self, outcome: Outcome) -> None:
        held = time.monotonic() - self.started
        status: str = outcome.status
        if status == "fenced":  # no end: only the device time this host spent on it
            metrics.observe_held(status, self.tenant, held)
            return
        if status == "retry":
            status = "requeue" if isinstance(outcome, Requeue) else "retry"
            metrics.observe_retry(status, self.tenant, labels.failure_reason(outcome.error))
        else:
            self._count_end(outcome)
        metrics.observe_held(status, self.tenant, held)
        _vram_after_job()
        if outcome.result is None:
            self._record(status, labels.failure_reason(outcome.error), held)

    def _count_end(self, outcome: Outcome) -> None:
        """Count the job's end, unless a run that died before its result was stored counted
        this submission's same end (``worker.concerns.endmark``). Marked first, then counted
        (nothing between the two can fail): a run that lost the job's lease meanwhile has its
        mark refused and counts nothing; a mark Redis did not answer still counts."""
        mark = EndMark(getattr(self.task.app.backend, "client", None), self.run.spec,
                       keys.COUNTED_END_FIELD, "counted", run_lease(self.run))
        if mark.seen(outcome.status):
            return
        mark.mark(outcome.status)
        if mark.refused:
            return
        if outcome.status == "failure":
            metrics.observe_job("failure", self.tenant, None,
                                reason=labels.failure_reason(outcome.error))
        else:
            metrics.observe_job(outcome.status, self.tenant, outcome.result)

    def _record(self, status: str, reason: str, held: float) -> None:
        """Leave a HeldRun in Redis (the result backend's client), kept as long as results."""
        spec = self.run.spec
        keep_held(getattr(self.task.app.backend, "client", None), HeldRun(
            job_id=spec.job_id, tenant=spec.tenant, status=status,  # type: ignore[arg-type]
            reason="" if status == "cancelled" else reason, node=self.node,
            device=_device(self.run.settings), started_at=self.started_at,
            finished_at=self.started_at + held, gpu_seconds=held, prices=_prices(),
        ), self.run.settings)


def keep_held(client: Any, record: HeldRun, settings: Settings) -> None:
    """Leave ``record`` in Redis (the result backend's ``client``) for ``framefleet cost
    report``, kept as long as results; nothing in the embedded mode (no fleet report)."""
    if not isinstance(client, redis.Redis):
        return
    key = keys.held(job_key(record.tenant, record.job_id), secrets.token_hex(6))
    try:
        client.set(key, record.model_dump_json(), ex=settings.result_expires_s)
    except redis.RedisError as e:
        log.warning("job %s: held time not recorded: %s", key, e)


def _redelivered(request: Any) -> bool:
    info = getattr(request, "delivery_info", None) or {}
    return bool(info.get("redelivered") or getattr(request, "redelivered", False))


def _device(settings: Settings) -> str:
    """``cpu`` or ``cuda:0``, as the runner's WorkerInfo says it."""
    from worker.devices import resolve_device

    try:
        return str(resolve_device(settings.device))
    except FramefleetError:
        return settings.device


def _prices() -> Any:
    try:
        return configured_prices()
    except FramefleetError:  # a broken pricing file: the time still counts, unpriced
        return None


def _vram_after_job() -> None:
    """``framefleet_torch_vram_after_job_bytes`` (CUDA only): what the job left held."""
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    if cuda is not None and cuda.is_initialized():
        metrics.VRAM_AFTER_JOB.labels(kind="allocated").set(cuda.memory_allocated())
        metrics.VRAM_AFTER_JOB.labels(kind="reserved").set(cuda.memory_reserved())
