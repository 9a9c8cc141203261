"""The task body's own checks on receipt, before any concern runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from celery import Celery

from producer.errors import FatalJobError
from producer.settings import get_settings
from producer.state.control import flags_for
from producer.wire.spec import JobResult
from tests.worker.concerns.scripted import counts, job_spec
from worker import tasks
from worker.concerns.lease import JobLease
from worker.run import DecoderCache


def test_output_outside_the_fleet_prefix_fails_at_once_naming_the_field(
    app: Celery, tmp_path: Path, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tasks, "_decoders", DecoderCache(torch.device("cpu")))
    monkeypatch.setenv("FRAMEFLEET_FILE_ROOTS", str(tmp_path))
    spec = job_spec(tmp_path, tenant)
    task = tasks.register(app)
    results = {}
    for prefix in (f"{(tmp_path / 'out').as_uri()}/", (tmp_path / "elsewhere").as_uri(),
                   f"{(tmp_path / 'ou').as_uri()}"):
        monkeypatch.setenv("FRAMEFLEET_OUTPUT_PREFIX", prefix)
        get_settings.cache_clear()
        try:
            job = spec.model_copy(update={"job_id": f"{spec.job_id}-{len(results)}"})
            results[prefix] = task.apply(args=[job.model_dump(mode="json")], task_id=job.key)
        finally:
            get_settings.cache_clear()
    inside, outside, sibling = results.values()
    assert inside.state == "SUCCESS", inside.traceback
    for refused in (outside, sibling):
        assert refused.state == "FAILURE"
        assert isinstance(refused.result, FatalJobError)
        assert str(refused.result).startswith("output.uri: ")
        assert "FRAMEFLEET_OUTPUT_PREFIX" in str(refused.result)


@pytest.fixture
def real_task(app: Celery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The real task on ``app``, with CPU decoders and the temp folder as the file root."""
    monkeypatch.setattr(tasks, "_decoders", DecoderCache(torch.device("cpu")))
    monkeypatch.setenv("FRAMEFLEET_FILE_ROOTS", str(tmp_path))
    get_settings.cache_clear()
    try:
        yield tasks.register(app)
    finally:
        get_settings.cache_clear()


def test_two_tenants_run_one_job_id_each_their_own(
    app: Celery, tmp_path: Path, real_task: Any
) -> None:
    # Given two tenants that both use the job_id "shared-id", with different specs
    acme = job_spec(tmp_path, "acme").model_copy(update={"job_id": "shared-id"})
    evil = acme.model_copy(update={"tenant": "evil", "priority": 9})
    assert acme.key != evil.key and acme.digest() != evil.digest()
    # When both run
    results = {s.tenant: real_task.apply(args=[s.model_dump(mode="json")], task_id=s.key)
               for s in (evil, acme)}
    # Then each succeeded into its own folder, under its own claim
    for spec in (acme, evil):
        assert results[spec.tenant].state == "SUCCESS", results[spec.tenant].traceback
        result = JobResult.model_validate(results[spec.tenant].result)
        assert (result.manifest.tenant, result.manifest.job_id) == (spec.tenant, "shared-id")
        assert f"/{spec.tenant}/shared-id/" in result.manifest_uri
        assert flags_for(app).registered(spec.key) == spec.digest()


def test_a_message_whose_id_is_another_jobs_key_is_dropped_and_stores_nothing(
    app: Celery, tmp_path: Path, real_task: Any
) -> None:
    # Given acme's job, failed for good (its result is what acme reads)
    victim = job_spec(tmp_path, "acme")
    flags_for(app).claim(victim.key, victim.digest())
    app.backend.mark_as_failure(victim.key, FatalJobError("acme's own failure"))
    # When raw messages arrive under acme's key: evil's own spec, a conflicting spec of
    # acme's job, and a body that is no spec at all
    evil = job_spec(tmp_path, "evil")
    conflicting = victim.model_copy(update={"priority": 1})
    for payload in (evil.model_dump(mode="json"), conflicting.model_dump(mode="json"),
                    {"not": "a spec"}):
        real_task.apply(args=[payload], task_id=victim.key)
    # Then acme's stored result is still acme's failure, and evil's job never ran
    meta = app.backend.get_task_meta(victim.key)
    assert meta["status"] == "FAILURE" and "acme's own failure" in str(meta["result"])
    assert flags_for(app).registered(evil.key) is None
    assert not (tmp_path / "out" / "evil").exists()


def test_a_bad_message_under_an_unknown_id_still_fails_naming_the_field(
    app: Celery, real_task: Any
) -> None:
    result = real_task.apply(args=[{"job_id": "x", "output": {"uri": "nope"}}], task_id="x")
    assert result.state == "FAILURE" and "output.uri" in str(result.result)


def test_a_duplicate_that_takes_the_lease_after_a_cancel_ended_the_job_is_dropped(
    app: Celery, tmp_path: Path, tenant: str, real_task: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a job cancelled while queued, and two deliveries of its message (kombu restores
    # an unacked one after Redis came back): the second passes the claim, and before it takes
    # the lease the first runs whole, finds the cancel and ends the job
    spec = job_spec(tmp_path, tenant)
    payload = spec.model_dump(mode="json")
    flags_for(app).set_cancel(spec.key)
    real_acquire, calls, first = JobLease.acquire, [], []

    def acquire(lease: JobLease) -> bool:
        calls.append(lease)
        if len(calls) == 1:  # the second delivery, between its claim and its lease
            first.append(real_task.apply(args=[payload], task_id=spec.key))
        return real_acquire(lease)

    monkeypatch.setattr(JobLease, "acquire", acquire)
    real_task.apply(args=[payload], task_id=spec.key)
    # Then the job ended once: REVOKED, one cancel counted (seen: two, and two ledger records)
    assert len(first) == 1 and len(calls) == 2
    assert app.backend.get_task_meta(spec.key)["status"] == "REVOKED"
    assert counts(tenant) == {"success": 0, "failure": 0, "retry": 0, "cancelled": 1}


def test_a_duplicate_that_takes_the_lease_as_the_job_succeeds_finds_the_success(
    app: Celery, tmp_path: Path, tenant: str, real_task: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a job, and a duplicate delivery of its message that arrives the moment the run
    # lets the lease go (Celery stores the result as a worker does)
    monkeypatch.setattr(real_task, "store_eager_result", True)
    spec = job_spec(tmp_path, tenant)
    payload = spec.model_dump(mode="json")
    real_release, duplicate = JobLease.release, []

    def release(lease: JobLease) -> None:
        real_release(lease)
        if not duplicate:
            duplicate.append(None)  # (the duplicate's own lease, if it takes one, is plain)
            duplicate[0] = real_task.apply(args=[payload], task_id=spec.key)

    monkeypatch.setattr(JobLease, "release", release)
    first = real_task.apply(args=[payload], task_id=spec.key)
    # Then the lease was let go only once the SUCCESS was stored: the duplicate found it and
    # was dropped, and the job ran and was counted once (seen: it ran twice)
    assert first.state == "SUCCESS", first.traceback
    assert len(duplicate) == 1 and duplicate[0].state == "IGNORED"
    assert counts(tenant) == {"success": 1, "failure": 0, "retry": 0, "cancelled": 0}
