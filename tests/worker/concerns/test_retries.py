"""Retries: the retry budget with back-off, and requeues with a cap of their own."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
import torch
from celery import Celery, Task, _state
from celery.exceptions import Retry

from producer.app import QUEUE, make_app
from producer.errors import DeviceOutOfMemory, FatalJobError, JobCancelled, StorageError
from producer.settings import Settings, get_settings
from producer.state import keys
from producer.state.control import flags_for
from producer.wire.spec import JobResult, JobSpec
from tests.require import require_binary
from tests.services import REDIS_INSTALL, RedisServer
from tests.services.endpoint import TcpProxy
from tests.worker.concerns.scripted import Scripted, counts, job_spec, real_run
from worker import tasks
from worker.concerns.lease import FAILOVER_S
from worker.concerns.retries import backoff, retry_later
from worker.run import DecoderCache, Run

#: How long the broker's address answers nothing but closed connections (the failover run
#: that lost a job this way had 12 s; Celery's own send gave up after about 6).
AWAY_S = 8.0


def test_backoff_doubles_up_to_its_cap() -> None:
    s = Settings(retry_backoff_s=2.0, retry_backoff_max_s=10.0)
    assert [backoff(n, s) for n in range(5)] == [2.0, 4.0, 8.0, 10.0, 10.0]


def test_a_retryable_error_spends_the_budget_then_fails(
    app: Celery, tmp_path: Path, tenant: str
) -> None:
    # Given a run that always hits a retryable error, and a budget of two retries
    spec = job_spec(tmp_path, tenant)

    def work(run: Run, attempt: int) -> JobResult:
        raise StorageError(f"S3 503 on attempt {attempt}")

    scripted = Scripted(app, spec, Settings(file_roots=str(tmp_path), retry_max=2), work)
    # When the task runs
    result = scripted.apply(spec.key)
    # Then it ran three times and failed with the last error
    assert scripted.attempts == 3
    assert result.state == "FAILURE"
    assert isinstance(result.result, StorageError) and "attempt 3" in str(result.result)
    assert counts(tenant) == {"success": 0, "failure": 1, "retry": 2, "cancelled": 0}


def test_a_retry_that_succeeds_returns_the_result(
    app: Celery, tmp_path: Path, tenant: str
) -> None:
    spec = job_spec(tmp_path, tenant)
    real = real_run(DecoderCache(torch.device("cpu")))

    def work(run: Run, attempt: int) -> JobResult:
        if attempt == 1:
            raise StorageError("connection reset")
        return real(run)

    scripted = Scripted(app, spec, Settings(file_roots=str(tmp_path), retry_max=1), work)
    result = scripted.apply(spec.key)
    assert result.state == "SUCCESS"
    assert JobResult.model_validate(result.result).manifest.frames == 13
    assert counts(tenant) == {"success": 1, "failure": 0, "retry": 1, "cancelled": 0}


def test_a_fatal_error_fails_at_once(app: Celery, tmp_path: Path, tenant: str) -> None:
    spec = job_spec(tmp_path, tenant)

    def work(run: Run, attempt: int) -> JobResult:
        raise FatalJobError("input.uri: not a latents file")

    scripted = Scripted(app, spec, Settings(file_roots=str(tmp_path), retry_max=5), work)
    result = scripted.apply(spec.key)
    assert scripted.attempts == 1
    assert result.state == "FAILURE" and "input.uri" in str(result.result)
    assert counts(tenant)["failure"] == 1 and counts(tenant)["retry"] == 0


def test_requeues_do_not_spend_the_retry_budget(
    app: Celery, tmp_path: Path, tenant: str
) -> None:
    # Given a run requeued once (the OOM fallback), then always hitting a retryable error
    spec = job_spec(tmp_path, tenant)

    def work(run: Run, attempt: int) -> JobResult:
        if attempt == 1:
            raise DeviceOutOfMemory("CUDA out of memory")
        raise StorageError(f"S3 503 on attempt {attempt}")

    scripted = Scripted(app, spec, Settings(file_roots=str(tmp_path), retry_max=2), work)
    # When the task runs
    result = scripted.apply(spec.key)
    # Then the error still got the whole budget: the requeue, then one try and two retries
    assert scripted.attempts == 4
    assert [(r.requeues, r.error_retries) for r in scripted.runs] == [
        (0, 0), (1, 0), (1, 1), (1, 2)]
    assert result.state == "FAILURE" and "attempt 4" in str(result.result)


def test_requeues_have_a_cap_of_their_own(
    app: Celery, redis_url: str, tmp_path: Path, tenant: str
) -> None:
    # Given a node that is preempted on every run, and at most two requeues
    spec = job_spec(tmp_path, tenant)
    nodes = set()

    def work(run: Run, attempt: int) -> JobResult:
        nodes.add(run.node)
        flags_for(app).set_preempted(str(run.node))
        assert run.cancelled()
        raise JobCancelled("stopped between chunks")

    settings = Settings(file_roots=str(tmp_path), max_requeues=2, cancel_poll_s=0)
    scripted = Scripted(app, spec, settings, work)
    try:
        result = scripted.apply(spec.key)
    finally:
        redis.Redis.from_url(redis_url).delete(*(keys.preempted(str(n)) for n in nodes))
    # Then the third requeue is refused: FAILURE naming the setting
    assert scripted.attempts == 3
    assert result.state == "FAILURE"
    assert isinstance(result.result, FatalJobError)
    assert "requeued 2 times (FRAMEFLEET_MAX_REQUEUES=2)" in str(result.result)


def test_lease_waits_are_requeues_not_retries(
    app: Celery, tmp_path: Path, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the real task, whose lease is held elsewhere for three looks, then a run that
    # always hits a retryable error, and a budget of two retries
    waits, runs = [False, False, False], []
    monkeypatch.setattr(tasks.JobLease, "acquire", lambda self: waits.pop() if waits else True)

    def run_job(spec: JobSpec, decoders: Any, run: Run) -> JobResult:
        runs.append(spec.job_id)
        raise StorageError(f"S3 503 on run {len(runs)}")

    monkeypatch.setattr(tasks, "run_job", run_job)
    monkeypatch.setenv("FRAMEFLEET_RETRY_MAX", "2")
    get_settings.cache_clear()
    try:
        task = tasks.register(app)
        spec = job_spec(tmp_path, tenant)
        result = task.apply(args=[spec.model_dump(mode="json")], task_id=spec.key)
    finally:
        get_settings.cache_clear()
    # Then the error got its whole budget after the three lease waits: one run, two retries
    assert len(runs) == 3, runs
    assert result.state == "FAILURE" and "run 3" in str(result.result)


def test_a_retry_sent_while_the_broker_is_away_goes_out_once_it_is_back(tmp_path: Path) -> None:
    # Given a job's task on a worker that reaches its broker through one address (a managed
    # Redis's endpoint), whose primary then dies: the address takes each new connection and
    # closes it at once, until the new primary answers there AWAY_S later
    server = RedisServer(require_binary("redis-server", REDIS_INSTALL), tmp_path)
    server.start()
    proxy = TcpProxy(server.port)
    url = f"redis://127.0.0.1:{proxy.port}/0"
    app = make_app(url, url)

    @app.task(bind=True, name="framefleet.test_retry_probe")
    def probe(self: Task) -> None:
        """A task whose retry is sent by hand below."""

    raised: list[BaseException] = []

    def retry() -> None:  # a task's request is per thread: pushed on the sending one
        probe.push_request(id="away-1", args=[], kwargs={}, retries=0, called_directly=False,
                           delivery_info={"exchange": "", "routing_key": QUEUE})
        try:
            retry_later(probe, countdown=0)
        except BaseException as e:  # noqa: BLE001 - what it raised is the assertion
            raised.append(e)
        finally:
            probe.pop_request()

    server.stop()
    # When the run sends its retry meanwhile, from a pool process that has sent nothing yet
    # (its producer's connection is made now) and never waits on results (Celery sets this
    # in its pool processes: a send then subscribes to no result)
    _state._set_task_join_will_block(True)
    sender = threading.Thread(target=retry)
    t0 = time.monotonic()
    sender.start()
    try:
        time.sleep(AWAY_S)
        server.start()  # from this thread: the server dies with the thread that started it
        sender.join(FAILOVER_S + 10)
        # Then the retry went out once the broker answered: Celery's Retry, not the Reject that
        # lost the job (kombu gives up making a connection after broker_connection_timeout,
        # 4 s), and its message is in the queue
        assert [type(e) for e in raised] == [Retry], raised
        assert AWAY_S < time.monotonic() - t0 < FAILOVER_S + 10
        r = redis.Redis(port=server.port)
        queued = [json.loads(m)["headers"]["id"] for key in r.scan_iter(match=f"{QUEUE}*")
                  if r.type(key) == b"list" for m in r.lrange(key, 0, -1)]
        assert queued == ["away-1"], queued
    finally:
        sender.join(FAILOVER_S + 10)
        _state._set_task_join_will_block(False)
        proxy.close()
        server.stop()
