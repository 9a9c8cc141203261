"""Cancel and preemption: polled between chunks; REVOKED, or requeued for another node."""

from __future__ import annotations

from pathlib import Path

import redis
import torch
from celery import Celery

from producer.errors import JobCancelled
from producer.settings import Settings
from producer.state import keys
from producer.state.control import flags_for
from producer.wire.spec import JobResult
from tests.worker.concerns.scripted import Scripted, counts, job_spec, real_run
from worker.run import DecoderCache, Run


def test_cancel_before_start_is_revoked_and_runs_nothing(
    app: Celery, tmp_path: Path, tenant: str
) -> None:
    spec = job_spec(tmp_path, tenant)
    flags_for(app).set_cancel(spec.key)

    def work(run: Run, attempt: int) -> JobResult:
        raise AssertionError("a cancelled job must not run")

    scripted = Scripted(app, spec, Settings(file_roots=str(tmp_path)), work)
    scripted.apply(spec.key)
    meta = app.backend.get_task_meta(spec.key)
    assert meta["status"] == "REVOKED"
    assert "cancelled before it started" in str(meta["result"])
    assert counts(tenant) == {"success": 0, "failure": 0, "retry": 0, "cancelled": 1}


def test_a_cancel_counted_by_a_run_killed_before_its_state_is_counted_once(
    app: Celery, redis_url: str, tmp_path: Path, tenant: str
) -> None:
    # Given a cancelled job whose run counted its end and died before REVOKED was stored (the
    # storm: a pool process SIGKILLed then), so that its message came again
    spec = job_spec(tmp_path, tenant)
    flags = flags_for(app)
    flags.set_cancel(spec.key)

    def work(run: Run, attempt: int) -> JobResult:
        raise AssertionError("a cancelled job must not run")

    scripted = Scripted(app, spec, Settings(file_roots=str(tmp_path)), work)
    scripted.apply(spec.key)
    redis.Redis.from_url(redis_url).delete(keys.result(spec.key))  # never stored
    # When that delivery ends the same way
    scripted.apply(spec.key)
    # Then the end was counted once (seen: twice, "framefleet_jobs_total 4 > 3 ends")
    assert app.backend.get_task_meta(spec.key)["status"] == "REVOKED"
    assert counts(tenant)["cancelled"] == 1
    # And a resubmit (which takes the job's "has run" mark) is a new end, counted again
    flags.mark_started(spec.key)
    assert flags.take_started(spec.key)
    scripted.apply(spec.key)
    assert counts(tenant)["cancelled"] == 2


def test_cancel_mid_run_is_polled_and_revoked(app: Celery, tmp_path: Path, tenant: str) -> None:
    spec = job_spec(tmp_path, tenant)
    polls: list[bool] = []

    def work(run: Run, attempt: int) -> JobResult:
        polls.append(run.cancelled())
        flags_for(app).set_cancel(run.spec.key)
        polls.append(run.cancelled())
        raise JobCancelled(f"job {run.spec.job_id} was cancelled")

    scripted = Scripted(app, spec, Settings(file_roots=str(tmp_path), cancel_poll_s=0), work)
    scripted.apply(spec.key)
    assert polls == [False, True]
    assert scripted.attempts == 1
    assert app.backend.get_task_meta(spec.key)["status"] == "REVOKED"
    assert counts(tenant)["cancelled"] == 1


def test_preemption_requeues_outside_the_budget(
    app: Celery, redis_url: str, tmp_path: Path, tenant: str
) -> None:
    # Given a node that is preempted while the job runs, and no retry budget at all
    spec = job_spec(tmp_path, tenant)
    real = real_run(DecoderCache(torch.device("cpu")))
    r = redis.Redis.from_url(redis_url)

    def work(run: Run, attempt: int) -> JobResult:
        if attempt == 1:
            flags_for(app).set_preempted(str(run.node))
            assert run.cancelled()
            raise JobCancelled("stopped between chunks")
        # The next delivery (another worker in a fleet; here the same, no longer flagged)
        r.delete(keys.preempted(str(run.node)))
        return real(run)

    settings = Settings(file_roots=str(tmp_path), retry_max=0, cancel_poll_s=0)
    scripted = Scripted(app, spec, settings, work)
    # When the task runs
    result = scripted.apply(spec.key)
    # Then the job went back to the queue (not REVOKED, not failed) and its next run succeeded
    assert scripted.attempts == 2
    assert result.state == "SUCCESS"
    assert counts(tenant) == {"success": 1, "failure": 0, "retry": 1, "cancelled": 0}
