"""WorkerLosses: the poison cap on runs whose worker died under them."""

from __future__ import annotations

from pathlib import Path

import redis
import torch
from celery import Celery

from producer.errors import FatalJobError, JobStuck
from producer.settings import Settings
from producer.state import keys
from producer.state.control import flags_for
from producer.wire.spec import JobResult
from tests.worker.concerns.scripted import Scripted, counts, job_spec, real_run
from worker.run import DecoderCache, Run


def _lost_runs(app: Celery, job_id: str, nodes: list[str]) -> None:
    """Runs of ``job_id`` on ``nodes`` that started and whose worker died (never ended)."""
    flags = flags_for(app)
    for n, node in enumerate(nodes):
        flags.start_run(job_id, f"{node} {1000 + n} t{n}")


def test_a_job_that_lost_its_worker_too_often_fails_naming_the_node(
    app: Celery, tmp_path: Path, tenant: str
) -> None:
    # Given a job whose worker died under it three times, the last on gpu7@lost
    spec = job_spec(tmp_path, tenant)
    _lost_runs(app, spec.key, ["gpu1@a", "gpu2@b", "gpu7@lost"])

    def work(run: Run, attempt: int) -> JobResult:
        raise AssertionError("a job over the cap must not run")

    scripted = Scripted(app, spec, Settings(file_roots=str(tmp_path), max_worker_losses=3), work)
    # When it is delivered again
    result = scripted.apply(spec.key)
    # Then it fails at once, saying so and naming the node, and is not retried
    assert result.state == "FAILURE"
    assert isinstance(result.result, FatalJobError)
    message = str(result.result)
    assert "lost 3 times" in message and "MAX_WORKER_LOSSES=3" in message
    assert "gpu7@lost" in message
    assert counts(tenant) == {"success": 0, "failure": 1, "retry": 0, "cancelled": 0}


def test_a_job_whose_last_run_hung_fails_at_once_stuck_in_its_stage_and_is_counted(
    app: Celery, tmp_path: Path, tenant: str
) -> None:
    from worker.stuck_metrics import STUCK

    # Given a job whose one run hung in decode (marked by the watchdog before its process
    # ended), with the cap far away
    spec = job_spec(tmp_path, tenant)
    _lost_runs(app, spec.key, ["gpu3@hung"])
    assert flags_for(app).mark_stuck(spec.key, "gpu3@hung", 1000, "decode", 912.3)
    before = STUCK.labels(stage="decode")._value.get()

    def work(run: Run, attempt: int) -> JobResult:
        raise AssertionError("a job whose run hung must not run again")

    settings = Settings(file_roots=str(tmp_path), max_worker_losses=5, stuck_s=900)
    # When it is delivered again
    result = Scripted(app, spec, settings, work).apply(spec.key)
    # Then it fails at once, naming the stage, the node and the limit, counted once
    assert result.state == "FAILURE" and isinstance(result.result, JobStuck)
    message = str(result.result)
    assert "stuck in decode" in message and "gpu3@hung" in message, message
    assert "no progress for 912 s" in message and "FRAMEFLEET_STUCK_S=900" in message
    assert STUCK.labels(stage="decode")._value.get() == before + 1
    assert counts(tenant) == {"success": 0, "failure": 1, "retry": 0, "cancelled": 0}
    # and its end forgets the mark: a resubmit runs
    assert flags_for(app).stuck(spec.key) is None


def test_a_job_under_the_loss_cap_runs_and_its_end_resets_the_count(
    app: Celery, redis_url: str, tmp_path: Path, tenant: str
) -> None:
    # Given a job whose worker died under it once
    spec = job_spec(tmp_path, tenant)
    _lost_runs(app, spec.key, ["gpu1@a"])
    real = real_run(DecoderCache(torch.device("cpu")))
    seen: list[dict[bytes, bytes]] = []
    r = redis.Redis.from_url(redis_url)
    key = keys.runs(spec.key)

    def work(run: Run, attempt: int) -> JobResult:
        seen.append(r.hgetall(key))
        return real(run)

    settings = Settings(file_roots=str(tmp_path), max_worker_losses=3)
    result = Scripted(app, spec, settings, work).apply(spec.key)
    # Then it ran (recorded as running, one loss on gpu1@a), and its success cleared the count
    assert result.state == "SUCCESS"
    assert seen[0][b"losses"] == b"1" and seen[0][b"lost_on"].startswith(b"gpu1@a ")
    assert set(r.hgetall(key)) <= {b"started", b"counted_end"}  # (the end's count, marked)
