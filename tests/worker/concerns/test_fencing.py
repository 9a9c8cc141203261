"""Fencing against a real Redis: a run that lost its job's lease (a zombie) learns it at its
next renewal, never takes the lease back, and none of its writes in Redis lands: end marks,
Celery's states. A run whose lease cannot be confirmed (Redis away) waits, and goes on once
it is."""

from __future__ import annotations

import json
import logging
import secrets
import subprocess
import sys
import threading
import time

import pytest
import redis

from producer.app import make_app
from producer.errors import LeaseLost
from producer.state import keys, lease_lua
from producer.wire.spec import DecoderSpec, InputSpec, JobSpec, OutputSpec
from tests.services import free_port
from tests.services.endpoint import TcpProxy
from tests.waiting import wait_for
from worker.concerns.endmark import EndMark
from worker.concerns.fenced_results import fenced_backend, hold, let_go
from worker.concerns.lease import LEASE_TTL_S, RENEW_EVERY_S, JobLease, still_the_run
from worker.stores.fence import WRITE_MARGIN_S


@pytest.fixture
def r(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


def _job() -> str:
    return f"fence-{secrets.token_hex(6)}"


def _taken_for_lost(r: redis.Redis, zombie: JobLease, node: str = "gpu0@b") -> JobLease:
    """What a partition longer than the lease does: the zombie's lease lapses (deleted here,
    as its expiry would) and another run takes the job's lease."""
    r.delete(zombie.key)
    other = JobLease(r, zombie.job, node)
    assert other.acquire()
    return other


def test_each_take_of_the_lease_is_a_new_generation(r: redis.Redis) -> None:
    job = _job()
    first = JobLease(r, job, "gpu0@a")
    assert first.acquire()
    first.release()
    second = JobLease(r, job, "gpu0@b")
    assert second.acquire()
    assert second.generation == first.generation + 1
    # A dead process's lease taken over by its node is a new generation too
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(30)
    r.set(second.key, f"gpu0@c {proc.pid} {secrets.token_hex(4)}", px=60_000)
    third = JobLease(r, job, "gpu0@c")
    assert third.acquire() and third.generation == second.generation + 1
    for lease in (second, third):
        lease.release()


def test_a_zombie_learns_it_lost_and_never_takes_the_lease_back(
        r: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    zombie = JobLease(r, _job(), "gpu0@a")
    assert zombie.acquire()
    zombie.check("a segment")  # held: a write may land
    # Given the job taken by another run while this one was cut off
    with caplog.at_level(logging.ERROR, logger="worker.concerns.lease"):
        other = _taken_for_lost(r, zombie)
        # Then its next renewal finds out, and says who holds the job now
        wait_for(lambda: zombie.lost, RENEW_EVERY_S + 3, "the lease found lost")
    assert f"generation {zombie.generation} on gpu0@a" in caplog.text
    assert f"now held by gpu0@b {other.token.split(' ')[1]}" in caplog.text
    # And every write it still tries is refused: in the store (the fence) and in Redis
    with pytest.raises(LeaseLost, match="segment-00003.mp4 not written"):
        zombie.check("segment-00003.mp4")
    with pytest.raises(LeaseLost):
        zombie.guard()
    runs = keys.runs(zombie.job)
    assert zombie.fenced_eval(lease_lua.FENCED_HSET, (runs,), "f", "zombie", 60) == 0
    assert other.fenced_eval(lease_lua.FENCED_HSET, (runs,), "f", "other", 60) == 1
    assert r.hget(runs, "f") == b"other"
    # When the other run ends and lets the lease go, the zombie does not take it back
    other.release()
    time.sleep(2 * RENEW_EVERY_S + 0.5)
    assert r.get(zombie.key) is None and zombie.lost
    zombie.release()


def test_a_lapsed_lease_is_not_taken_back_once_the_job_ended(r: redis.Redis) -> None:
    lease = JobLease(r, _job(), "gpu0@a")
    assert lease.acquire()
    # Given a job that ended (another run stored its state while this one's lease lapsed)
    r.set(keys.result(lease.job), json.dumps({"status": "SUCCESS", "result": None}))
    r.delete(lease.key)
    # Then the renewal does not take it again: this run is lost
    wait_for(lambda: lease.lost, RENEW_EVERY_S + 3, "the lease found lost")
    assert r.get(lease.key) is None
    lease.release()


def test_writes_wait_while_the_lease_cannot_be_confirmed(redis_url: str) -> None:
    # Given a run whose Redis path is cut (a proxy that forwards nowhere)
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    proxy = TcpProxy(port)
    client = redis.Redis(host="127.0.0.1", port=proxy.port, socket_timeout=1,
                         socket_connect_timeout=1)
    lease = JobLease(client, _job(), "gpu0@a")
    try:
        assert lease.acquire()
        proxy.switch(free_port())
        # When its lease is no longer known to hold for a write's margin
        wait_for(lambda: lease.valid_until - time.monotonic() < WRITE_MARGIN_S,
                 LEASE_TTL_S, "the lease's margin spent")
        done: list[float] = []
        writer = threading.Thread(target=lambda: (lease.check("a segment"),
                                                  done.append(time.monotonic())))
        writer.start()
        time.sleep(1.5)
        # Then a write waits (neither lands nor fails) ...
        assert not done and writer.is_alive()
        # ... and goes on once the path heals and the lease is confirmed (nobody took it)
        proxy.switch(port)
        writer.join(LEASE_TTL_S)
        assert done and not lease.lost
    finally:
        proxy.switch(port)
        lease.release()
        proxy.close()


def _spec(job: str) -> JobSpec:
    return JobSpec(job_id=job, input=InputSpec(uri="file:///in/x.npy"),
                   decoder=DecoderSpec(name="pattern"), output=OutputSpec(uri="s3://b/out"))


def test_end_marks_are_left_only_by_the_run_that_holds_the_lease(
        r: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    zombie = JobLease(r, _job(), "gpu0@a")
    assert zombie.acquire()
    spec = _spec(zombie.job)
    other = _taken_for_lost(r, zombie)
    wait_for(lambda: zombie.lost, RENEW_EVERY_S + 3, "the lease found lost")
    # The zombie's mark is refused; the other run's lands, naming it
    refused = EndMark(r, spec, keys.COUNTED_END_FIELD, "counted", zombie)
    assert not refused.mark("success") and refused.refused  # and so it counts nothing
    assert EndMark(r, spec, keys.COUNTED_END_FIELD, "counted", other).mark("success")
    # The zombie, finding the other run's mark, says it was taken over, not "a run that died"
    with caplog.at_level(logging.WARNING, logger="worker.concerns.endmark"):
        assert EndMark(r, spec, keys.COUNTED_END_FIELD, "counted", zombie).seen("success")
    assert "which took the job over from this run" in caplog.text
    caplog.clear()
    # And a run of the same submission finds the end counted, by whom, not "a run that died"
    with caplog.at_level(logging.WARNING, logger="worker.concerns.endmark"):
        assert EndMark(r, spec, keys.COUNTED_END_FIELD, "counted").seen("success")
    assert f"by generation {other.generation} on gpu0@b" in caplog.text
    assert "died" not in caplog.text
    for lease in (zombie, other):
        lease.release()


def test_celery_stores_a_run_s_states_only_while_it_holds_the_lease(redis_url: str,
                                                                    r: redis.Redis) -> None:
    app = make_app(broker_url=redis_url, backend_url=redis_url)
    backend = fenced_backend(app)
    zombie = JobLease(r, _job(), "gpu0@a")
    assert zombie.acquire()
    hold(zombie.job, zombie)
    try:
        # While it holds the lease, its states are stored (and published, as Celery does)
        backend.store_result(zombie.job, {"frames_done": 1}, "PROGRESS")
        assert backend.get_task_meta(zombie.job)["status"] == "PROGRESS"
        # Once another run took the job, the zombie's end lands nowhere
        other = _taken_for_lost(r, zombie)
        backend.store_result(zombie.job, {"frames_done": 2}, "PROGRESS")
        r.set(keys.result(zombie.job), json.dumps({"status": "STARTED", "result": None}))
        backend.store_result(zombie.job, {"zombie": True}, "SUCCESS")
        assert json.loads(r.get(keys.result(zombie.job)) or b"{}")["status"] == "STARTED"
        # A task id with no lease in this process is Celery's as ever
        backend.store_result("no-lease-" + zombie.job, 1, "SUCCESS")
        assert backend.get_task_meta("no-lease-" + zombie.job)["status"] == "SUCCESS"
        other.release()
    finally:
        let_go(zombie.job)
        zombie.release()


def test_a_hard_time_limit_counts_only_for_the_job_s_own_run(r: redis.Redis) -> None:
    job = _job()
    assert still_the_run(r, job, "gpu0@a", 11)  # nothing recorded: no other run
    r.set(keys.lease(job), "gpu0@a 11 tok", px=60_000)
    assert still_the_run(r, job, "gpu0@a", 11)
    assert not still_the_run(r, job, "gpu0@a", 12)
    r.delete(keys.lease(job))
    r.hset(keys.runs(job), "running", "gpu0@b 7 abc")  # another run recorded itself since
    assert not still_the_run(r, job, "gpu0@a", 11)
    assert still_the_run(None, job, "gpu0@a", 11)  # the embedded mode: one host
