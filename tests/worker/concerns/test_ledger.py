"""JobLedger: one durable record per job end, with the runs that sent it back; and the refusal
of webhooks a worker cannot sign. Eager tasks against the session's real Redis (``scripted``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from urllib.parse import unquote

import pytest
import redis
import torch
from celery import Celery

from producer.errors import StorageError
from producer.settings import Settings
from producer.state import keys
from producer.state.ledger import LEDGER_LINK, LedgerReader
from producer.wire.spec import JobResult, NotifySpec
from tests.services import free_ports
from tests.worker.concerns.scripted import Scripted, counts, job_spec, real_run, real_work
from worker.run import DecoderCache, Run


def _settings(tmp: Path, **extra: object) -> Settings:
    return Settings(file_roots=str(tmp), ledger_uri=(tmp / "ledger").as_uri(), **extra)


def test_a_retried_job_that_succeeds_leaves_one_record_with_its_held_run(
    app: Celery, tmp_path: Path, tenant: str, redis_url: str
) -> None:
    # Given a job whose first run hits a retryable error and whose second succeeds
    spec = job_spec(tmp_path, tenant)
    real = real_run(DecoderCache(torch.device("cpu")))

    def work(run: Run, attempt: int) -> JobResult:
        if attempt == 1:
            raise StorageError("S3 503")
        return real(run)

    scripted = Scripted(app, spec, _settings(tmp_path, retry_max=1), work)
    # When it runs to its end
    assert scripted.apply(spec.key).state == "SUCCESS"
    # Then the ledger holds exactly one record of it: the result, the retried run's GPU time
    (record,) = LedgerReader((tmp_path / "ledger").as_uri(), Settings()).records()
    assert (record.key, record.status, record.tenant) == (spec.key, "success", tenant)
    assert record.result is not None and record.result.manifest.frames == 13
    assert [(h.status, h.reason) for h in record.held] == [("retry", "StorageError")]
    assert [s.state for s in record.states] == ["STARTED", "SUCCESS"]
    assert record.spec_digest == spec.digest() and record.output_uri == spec.output_prefix
    day = next((tmp_path / "ledger").glob("day=*"))
    assert (day / f"tenant={tenant}").is_dir()
    # and the kept run is gone from Redis; the job's folder names the record
    assert not redis.Redis.from_url(redis_url).exists(keys.ledger_runs(spec.key))
    link = json.loads((Path(spec.output_prefix.removeprefix("file://")) / LEDGER_LINK)
                      .read_text())
    assert link["key"] == spec.key and [e["status"] for e in link["records"]] == ["success"]
    # (a file:// URI quotes the partitions' "=": file:///…/ledger/day%3D2026-12-01/…)
    assert unquote(link["records"][0]["uri"]).startswith((tmp_path / "ledger").as_uri() + "/day=")


def test_a_failed_job_is_recorded_with_its_error(
    app: Celery, tmp_path: Path, tenant: str
) -> None:
    spec = job_spec(tmp_path, tenant)

    def work(run: Run, attempt: int) -> JobResult:
        raise StorageError(f"S3 503 on attempt {attempt}")

    Scripted(app, spec, _settings(tmp_path, retry_max=1), work).apply(spec.key)
    (record,) = LedgerReader((tmp_path / "ledger").as_uri(), Settings()).records()
    assert (record.status, record.reason) == ("failure", "StorageError")
    assert record.error == "StorageError: S3 503 on attempt 2"
    assert [h.status for h in record.held] == ["retry", "failure"]
    assert record.result is None and record.gpu_seconds == sum(h.gpu_seconds for h in record.held)


def test_a_ledger_that_cannot_be_written_changes_nothing_about_the_job(
    app: Celery, tmp_path: Path, tenant: str, caplog: pytest.LogCaptureFixture
) -> None:
    spec = job_spec(tmp_path, tenant)
    real = real_run(DecoderCache(torch.device("cpu")))
    outside = Settings(file_roots=str(tmp_path), ledger_uri="file:///proc/ledger")
    with caplog.at_level(logging.ERROR, logger="worker.concerns.ledger"):
        result = Scripted(app, spec, outside, lambda run, attempt: real(run)).apply(spec.key)
    assert result.state == "SUCCESS"
    (line,) = [r.getMessage() for r in caplog.records if "ledger record not written" in
               r.getMessage()]
    assert "FRAMEFLEET_LEDGER_URI: file:///proc/ledger" in line and '"status":"success"' in line


def test_webhooks_on_a_worker_without_a_secret_fail_at_once_naming_notify(
    app: Celery, tmp_path: Path, tenant: str
) -> None:
    # Given a job that asks for webhooks (to a closed loopback port: nothing leaves the host),
    # on a worker with no FRAMEFLEET_WEBHOOK_SECRET
    (port,) = free_ports(1)
    receiver = f"http://127.0.0.1:{port}"
    spec = job_spec(tmp_path, tenant).model_copy(
        update={"notify": NotifySpec(urls=(f"{receiver}/a",))})
    ran: list[int] = []

    def work(run: Run, attempt: int) -> JobResult:
        ran.append(attempt)
        raise AssertionError("must not run")

    result = Scripted(app, spec, Settings(file_roots=str(tmp_path), webhook_secret=None),
                      work).apply(spec.key)
    # Then it fails before any work, and the message names notify and the setting
    assert result.state == "FAILURE" and ran == []
    assert str(result.result).startswith("notify: this worker has no FRAMEFLEET_WEBHOOK_SECRET")
    # With a secret, the same job runs
    real = real_run(DecoderCache(torch.device("cpu")))
    signed = Settings(file_roots=str(tmp_path), webhook_secret="s3cret", webhook_schemes="http",
                      webhook_hosts=f"{receiver}/")
    again = job_spec(tmp_path, tenant).model_copy(update={"notify": spec.notify})
    assert Scripted(app, again, signed, lambda run, attempt: real(run)).apply(
        again.key).state == "SUCCESS"


def test_a_run_killed_after_its_record_leaves_one_record(
    app: Celery, tmp_path: Path, tenant: str, redis_url: str
) -> None:
    # Given a job whose run wrote its success to the ledger and died before its result was
    # stored (SIGKILL in between: the storm found it), so that its message comes again
    spec = job_spec(tmp_path, tenant)
    work = real_work(DecoderCache(torch.device("cpu")))
    scripted = Scripted(app, spec, _settings(tmp_path), work)
    assert scripted.apply(spec.key).state == "SUCCESS"
    r = redis.Redis.from_url(redis_url)
    r.delete(keys.result(spec.key))  # the result that never reached Redis
    # When the message runs again and succeeds
    assert scripted.apply(spec.key).state == "SUCCESS"
    # Then the ledger still holds one record of the job's one end, counted once
    (record,) = LedgerReader((tmp_path / "ledger").as_uri(), Settings()).records()
    assert (record.key, record.status) == (spec.key, "success")
    assert counts(tenant)["success"] == 1


def test_a_record_marked_but_never_written_is_written_by_the_next_run(
    app: Celery, tmp_path: Path, tenant: str, redis_url: str
) -> None:
    # Given a job whose run marked its success's record, then was cut off before the record
    # landed (the mark names a record the ledger does not hold), and its result never stored
    spec = job_spec(tmp_path, tenant)
    scripted = Scripted(app, spec, _settings(tmp_path), real_work(DecoderCache(
        torch.device("cpu"))))
    assert scripted.apply(spec.key).state == "SUCCESS"
    r = redis.Redis.from_url(redis_url)
    r.delete(keys.result(spec.key))
    marked = r.hget(keys.runs(spec.key), f"{keys.LEDGER_END_FIELD}:uri")
    assert marked is not None and unquote(marked.decode()).startswith(
        (tmp_path / "ledger").as_uri())
    (first,) = (tmp_path / "ledger").rglob("*.json")
    first.unlink()
    # When the message runs again and succeeds
    assert scripted.apply(spec.key).state == "SUCCESS"
    # Then the ledger holds one record, written by that run; counted once
    (record,) = LedgerReader((tmp_path / "ledger").as_uri(), Settings()).records()
    assert (record.key, record.status) == (spec.key, "success")
    assert counts(tenant)["success"] == 1
