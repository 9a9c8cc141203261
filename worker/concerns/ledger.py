"""Ledger: every job's end leaves one durable record (``producer.state.ledger``), when
``FRAMEFLEET_LEDGER_URI`` is set.

A run that ends the job (success, failure, cancel) writes a ``LedgerRecord``: its states with
their times (QUEUED from the client's enqueue stamp, STARTED, the end), the result (manifest,
stage seconds, cost) or the error, and the GPU time of every run without a result. A run that
sends its job back (retry, requeue) is no end: its ``HeldRun`` waits in Redis
(``producer.state.keys.ledger_runs``) for the record of the run that ends the job. Then the job's
folder gets ``ledger.json``, naming the record.

Written once, after the end is decided: a ledger that cannot be written (store down, a
``file://`` ledger outside the roots) is logged as an error and changes nothing about the
job. The ends decided outside the concerns (the requeue cap of lease waits, Celery's hard time
limit) get their record through ``worker.concerns.outside``, with the same functions. A message
refused before it runs (its spec does not parse or breaks the fleet's rules, its job_id belongs
to another spec) is no job's run and has no record.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis
from celery import Task

from producer.settings import Settings
from producer.state import keys
from producer.wire.results import HeldRun, LedgerRecord, StateTime
from worker import labels
from worker.concerns.base import Concern, Outcome
from worker.concerns.endmark import EndMark
from worker.concerns.lease import JobLease, run_lease
from worker.concerns.metrics import _device, _prices, enqueued_at
from worker.concerns.retries import Requeue
from worker.run.run import Run
from worker.sinks.ledger import link_record, record_landed, record_uri, write_record

log = logging.getLogger(__name__)
END_STATE = {"success": "SUCCESS", "failure": "FAILURE", "cancelled": "REVOKED"}


def write_ledger(record: LedgerRecord, output_prefix: str, settings: Settings,
                 lease: JobLease | None = None, uri: str | None = None) -> None:
    """Write ``record`` (at ``uri``, default a new name) and name it in the job's folder
    (``output_prefix``), fenced by the run's ``lease`` (``worker.stores.fence``); a record
    that cannot be written is logged as an error with its content, and changes nothing."""
    try:
        uri = write_record(record, settings, lease, uri)
    except Exception as e:  # noqa: BLE001 - the job's end is decided; say it loudly
        log.error("job %s: ledger record not written: %s; the record was: %s",
                  record.key, e, record.model_dump_json())
        return
    try:
        link_record(record, uri, output_prefix, settings, lease)
    except Exception as e:  # noqa: BLE001 - an output folder it may not write (refused)
        log.warning("job %s: ledger record %s not linked from its folder: %s",
                    record.key, uri, e)


def earlier_runs(client: Any, key: str) -> list[HeldRun]:
    """The runs of job ``key`` that sent it back (retry, requeue), taken from Redis (the
    result backend's ``client``; None in the embedded mode: none)."""
    if not isinstance(client, redis.Redis):
        return []
    try:
        pipe = client.pipeline()
        pipe.lrange(keys.ledger_runs(key), 0, -1)
        pipe.delete(keys.ledger_runs(key))
        raw, _ = pipe.execute()
    except redis.RedisError as e:
        log.warning("job %s: earlier runs not read for the ledger: %s", key, e)
        return []
    return [HeldRun.model_validate_json(item) for item in raw]


class JobLedger(Concern):
    """Keeps the runs without a result, and writes the record of the job's end."""

    def __init__(self, run: Run, task: Task) -> None:
        super().__init__(run, task)
        self.started_at = time.time()
        self.started = time.monotonic()
        self.enqueued_at = enqueued_at(task.request)

    def on_outcome(self, outcome: Outcome) -> None:
        if self.run.settings.ledger_uri is None:
            return
        held = None if outcome.result is not None else self._held(outcome)
        if outcome.status == "retry":
            if held is not None:
                self._keep(held)
            return
        lease, settings = run_lease(self.run), self.run.settings
        mark = EndMark(self._client(), self.run.spec, keys.LEDGER_END_FIELD,
                       "recorded in the ledger", lease)
        record = self._record(outcome, held)
        if mark.seen(outcome.status):
            marked = mark.extra("uri")
            if marked is None or record_landed(marked, settings):
                return
            log.warning("job %s: the ledger record %s its end was marked with is not there "
                        "(the run that marked it was lost before it wrote it): written now",
                        record.key, marked)
        # Marked first, with the record's name, then written: a run cut off between the two
        # (its lease lost) leaves a mark whose record the next run finds missing or there.
        try:
            uri = record_uri(record, settings)
        except Exception:  # noqa: BLE001 - the ledger's own configuration: write_ledger says it
            write_ledger(record, self.run.spec.output_prefix, settings, lease)
            return
        mark.mark(outcome.status, uri=uri)
        if not mark.refused:
            write_ledger(record, self.run.spec.output_prefix, settings, lease, uri)

    def _held(self, outcome: Outcome) -> HeldRun:
        status: str = outcome.status
        if status == "retry":
            status = "requeue" if isinstance(outcome, Requeue) else "retry"
        spec, held = self.run.spec, time.monotonic() - self.started
        return HeldRun(
            job_id=spec.job_id, tenant=spec.tenant, status=status,  # type: ignore[arg-type]
            reason="" if status == "cancelled" else labels.failure_reason(outcome.error),
            node=self.node, device=_device(self.run.settings), started_at=self.started_at,
            finished_at=self.started_at + held, gpu_seconds=held, prices=_prices())

    def _client(self) -> Any:
        """The result backend's Redis client; None in the embedded mode."""
        client = getattr(self.task.app.backend, "client", None)
        return client if isinstance(client, redis.Redis) else None

    def _keep(self, held: HeldRun) -> None:
        """A run that sent its job back: its GPU time waits for the end's record."""
        client, key = self._client(), keys.ledger_runs(self.run.spec.key)
        if client is None:  # the embedded mode: one host, no retries worth keeping
            return
        try:
            client.pipeline().rpush(key, held.model_dump_json()).expire(
                key, self.run.settings.result_expires_s).execute()
        except redis.RedisError as e:
            log.warning("job %s: run without a result not kept for the ledger: %s",
                        self.run.spec.key, e)

    def _earlier(self) -> list[HeldRun]:
        """The runs that sent the job back before this one (and forget them)."""
        return earlier_runs(self._client(), self.run.spec.key)

    def _record(self, outcome: Outcome, held: HeldRun | None) -> LedgerRecord:
        spec, result = self.run.spec, outcome.result
        end = result.finished_at if result is not None else time.time()
        states = [StateTime(state="STARTED", at=self.started_at),
                  StateTime(state=END_STATE[outcome.status], at=end)]  # type: ignore[arg-type]
        if self.enqueued_at is not None:
            states.insert(0, StateTime(state="QUEUED", at=self.enqueued_at))
        error = outcome.error if outcome.status == "failure" else None
        return LedgerRecord(
            key=spec.key, job_id=spec.job_id, tenant=spec.tenant, spec_digest=spec.digest(),
            status=outcome.status,  # type: ignore[arg-type]
            reason="" if error is None else labels.failure_reason(error),
            error=None if error is None else f"{type(error).__name__}: {error}",
            node=self.node, states=tuple(states), error_retries=self.run.error_retries,
            requeues=self.run.requeues, output_uri=spec.output_prefix, result=result,
            held=(*self._earlier(), *(() if held is None else (held,))), finished_at=end)
