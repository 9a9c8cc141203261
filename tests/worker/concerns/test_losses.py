"""WorkerLosses: the poison cap on runs whose worker died under them."""

from __future__ import annotations

from pathlib import Path

import redis
import torch
from celery import Celery

from producer.errors import FatalJobError
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
    assert set(r.hgetall(key)) <= {b"started"}
