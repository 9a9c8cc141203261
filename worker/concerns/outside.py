"""Ends decided outside a run's concerns: each still gets its one count and ledger record.

Two routes end a job for good without its concerns (``worker.concerns.metrics``,
``worker.concerns.ledger``) ever seeing it:

- the requeue cap while another run holds the job's lease (``worker.tasks``): the pool
  process refuses to requeue it again, and no run of it started here;
- Celery's hard time limit: decided in the worker's main process, which kills the pool
  process that ran the job (no concern of that run gets to its end). The main process hands
  the end over (``Flags.hand_over_end``: a Redis list, files in the embedded mode), and a
  pool process records it (``take_over``): the next one that starts, or any worker's before
  its next job. The count lands in that process's ``/metrics`` (a killed process's counters
  are gone anyway).

``record_end`` does what the two concerns do at an end: ``framefleet_jobs_total`` (and the
held time of a run that held the device), a ``HeldRun`` for the cost report, and the
``LedgerRecord`` with the runs that sent the job back before.

Exactly once: a hard-limit end is handed over only if the killed run had not reached its end
itself (``Flags.end_killed_run``: its run record still names it). A run killed before it
recorded itself (within its first Redis calls) is not counted.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from producer.settings import Settings
from producer.state.control import Flags
from producer.wire.results import HeldRun, LedgerRecord, StateTime
from producer.wire.spec import JobSpec
from worker import labels, metrics
from worker.concerns.ledger import earlier_runs, write_ledger
from worker.concerns.metrics import _device, _prices, keep_held

log = logging.getLogger(__name__)


class OutsideEnd(BaseModel):
    """A job's FAILURE decided outside its run's concerns, and what its records need."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    spec: JobSpec
    reason: str  # a value of ``worker.labels.REASONS``
    error: str  # ``Type: message``
    node: str
    finished_at: float
    started_at: float | None = None  # when the run that held the device started (if any)
    enqueued_at: float | None = None
    error_retries: int = 0
    requeues: int = 0


def failed_outside(spec: JobSpec, error: BaseException, node: str, *,
                   started_at: float | None = None, enqueued_at: float | None = None,
                   error_retries: int = 0, requeues: int = 0) -> OutsideEnd:
    """The ``OutsideEnd`` of ``spec`` failed now with ``error``."""
    return OutsideEnd(spec=spec, reason=labels.failure_reason(error),
                      error=f"{type(error).__name__}: {error}", node=node,
                      finished_at=time.time(), started_at=started_at, enqueued_at=enqueued_at,
                      error_retries=error_retries, requeues=requeues)


def record_end(end: OutsideEnd, settings: Settings, client: Any) -> None:
    """Count ``end`` and write its ledger record (``client``: the result backend's Redis, or
    None in the embedded mode). Never raises: the job's end is decided already."""
    spec = end.spec
    tenant = labels.tenant_label(spec.tenant, settings.metrics_tenant_names)
    held = None
    try:
        metrics.observe_job("failure", tenant, None, reason=end.reason)
        if end.started_at is not None:
            seconds = max(0.0, end.finished_at - end.started_at)
            metrics.observe_held("failure", tenant, seconds)
            held = HeldRun(job_id=spec.job_id, tenant=spec.tenant, status="failure",
                           reason=end.reason, node=end.node, device=_device(settings),
                           started_at=end.started_at, finished_at=end.finished_at,
                           gpu_seconds=seconds, prices=_prices())
            keep_held(client, held, settings)
    except Exception:  # counting must never change how the task ends
        log.exception("job %s: its end was not counted", spec.key)
    if settings.ledger_uri is not None:
        write_ledger(_record(end, held, earlier_runs(client, spec.key)), spec.output_prefix,
                     settings)


def _record(end: OutsideEnd, held: HeldRun | None, earlier: list[HeldRun]) -> LedgerRecord:
    spec, states = end.spec, []
    if end.enqueued_at is not None:
        states.append(StateTime(state="QUEUED", at=end.enqueued_at))
    if end.started_at is not None:
        states.append(StateTime(state="STARTED", at=end.started_at))
    states.append(StateTime(state="FAILURE", at=end.finished_at))
    return LedgerRecord(
        key=spec.key, job_id=spec.job_id, tenant=spec.tenant, spec_digest=spec.digest(),
        status="failure", reason=end.reason, error=end.error, node=end.node,
        states=tuple(states), error_retries=end.error_retries, requeues=end.requeues,
        output_uri=spec.output_prefix, held=(*earlier, *(() if held is None else (held,))),
        finished_at=end.finished_at)


def hand_over(end: OutsideEnd, flags: Flags, settings: Settings) -> None:
    """From the worker's main process: leave ``end`` for a pool process to record."""
    flags.hand_over_end(end.model_dump_json(), settings.result_expires_s)


def take_over(flags: Flags, settings: Settings, client: Any) -> int:
    """In a pool process: record every end handed over; how many. Never raises."""
    taken = 0
    try:
        while items := flags.take_ends():
            for item in items:
                try:
                    end = OutsideEnd.model_validate_json(item)
                except ValidationError as e:  # not ours (anyone may write to Redis): say so
                    log.error("a job end handed over is not one: %s", e)
                    continue
                record_end(end, settings, client)
                taken += 1
    except Exception:  # Redis away: the next pool process or job takes them
        log.exception("job ends handed over not taken")
    return taken
