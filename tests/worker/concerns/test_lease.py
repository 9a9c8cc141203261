"""The job lease against a real Redis: one holder, compare-and-delete, dead-process takeover,
renewal while the job runs, and a Redis that is away."""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis

from producer.settings import Settings
from tests.require import require_binary
from tests.services import REDIS_INSTALL, RedisServer, free_port
from tests.waiting import wait_for
from worker.concerns.lease import (
    FAILOVER_S,
    LEASE_RETRY_S,
    LEASE_TTL_S,
    JobLease,
    through_failover,
)


@pytest.fixture
def r(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


def _job() -> str:
    return f"lease-{secrets.token_hex(6)}"


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    return proc.pid


def test_one_holder_at_a_time_and_release_frees_it(r: redis.Redis) -> None:
    job = _job()
    first, second = JobLease(r, job, "gpu0@a"), JobLease(r, job, "gpu0@b")
    # Given a lease held by one worker
    assert first.acquire()
    try:
        # Then another worker cannot take it, and the key names the holder with a TTL
        assert not second.acquire()
        assert r.get(f"framefleet:lease:{job}") == first.token.encode()
        assert 0 < r.pttl(f"framefleet:lease:{job}") <= LEASE_TTL_S * 1000
    finally:
        first.release()
    # When it is released, the other worker gets it
    assert r.get(f"framefleet:lease:{job}") is None
    assert second.acquire()
    second.release()


def test_release_deletes_only_its_own_lease(r: redis.Redis) -> None:
    job = _job()
    holder, stranger = JobLease(r, job, "gpu0@a"), JobLease(r, job, "gpu1@a")
    assert holder.acquire()
    try:
        # A worker that never held it (a late release after expiry) must not delete it
        stranger.release()
        assert r.get(f"framefleet:lease:{job}") == holder.token.encode()
    finally:
        holder.release()


def test_a_dead_process_of_the_same_node_is_taken_over(r: redis.Redis) -> None:
    job = _job()
    key = f"framefleet:lease:{job}"
    # Given a lease left by a pool process of this node that died (SIGKILL, OOM killer)
    r.set(key, f"gpu0@a {_dead_pid()} {secrets.token_hex(8)}", px=60_000)
    lease = JobLease(r, job, "gpu0@a")
    # Then the requeued job may go on at once
    assert lease.acquire()
    try:
        assert r.get(key) == lease.token.encode()
    finally:
        lease.release()


@pytest.mark.parametrize("other", ["other node", "live process"])
def test_a_lease_that_may_be_alive_is_not_taken(r: redis.Redis, other: str) -> None:
    job = _job()
    key = f"framefleet:lease:{job}"
    # Another node's process cannot be checked from here; a live local one still runs the job
    holder = (f"gpu0@b {_dead_pid()} x" if other == "other node"
              else f"gpu0@a {os.getpid()} x")
    r.set(key, holder, px=60_000)
    assert not JobLease(r, job, "gpu0@a").acquire()
    assert r.get(key) == holder.encode()


def test_the_lease_is_renewed_while_the_job_runs(r: redis.Redis) -> None:
    job = _job()
    key = f"framefleet:lease:{job}"
    lease = JobLease(r, job, "gpu0@a")
    assert lease.acquire()
    try:
        # Given a lease about to expire
        r.pexpire(key, int(LEASE_TTL_S / 4 * 1000) + 1500)
        # When the renewal period passes and the lease would have expired without it
        time.sleep(LEASE_TTL_S / 4 + 2.0)
        # Then it is still held, for a full lifetime again
        assert r.get(key) == lease.token.encode()
        assert r.pttl(key) > LEASE_TTL_S * 1000 / 2
    finally:
        lease.release()


def test_a_lapsed_lease_is_taken_again_unless_another_run_holds_it(r: redis.Redis) -> None:
    job = _job()
    key = f"framefleet:lease:{job}"
    lease = JobLease(r, job, "gpu0@a")
    assert lease.acquire()
    other = b"gpu0@b 1 other-run"
    try:
        # Given a lease that lapsed while its run goes on (Redis away, the host stalled)
        r.delete(key)
        # Then the next renewal takes it again, for a full lifetime
        wait_for(lambda: r.get(key) == lease.token.encode(), LEASE_TTL_S / 4 + 3,
                 "the lease taken again")
        assert r.pttl(key) > LEASE_TTL_S * 1000 / 2 and not lease.lost
        # When another run took it meanwhile (the host was taken for lost)
        r.set(key, other, px=60_000)
        # Then the renewal leaves it to that run and says so
        wait_for(lambda: lease.lost, LEASE_TTL_S / 4 + 3, "the lease found lost")
        assert r.get(key) == other
    finally:
        lease.release()
    assert r.get(key) == other  # and the release does not delete it either


def test_no_renewal_takes_the_lease_again_after_its_release(r: redis.Redis) -> None:
    job = _job()
    key = f"framefleet:lease:{job}"
    for _ in range(2):
        lease = JobLease(r, job, "gpu0@a")
        assert lease.acquire()
        time.sleep(LEASE_TTL_S / 4 - 0.02)  # released about when the renewal is due
        lease.release()
        time.sleep(0.5)
        assert r.get(key) is None


def test_embedded_mode_always_grants() -> None:
    lease = JobLease(None, _job(), "demo@a")
    assert lease.acquire()
    lease.release()


def test_release_with_redis_away_logs_and_returns(caplog: pytest.LogCaptureFixture) -> None:
    # Given a lease whose Redis is gone (nothing listens on the port)
    away = redis.Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=1)
    lease = JobLease(away, _job(), "gpu0@a")
    # When the job ends, release logs and the task goes on (the lease expires by itself)
    with caplog.at_level(logging.WARNING, logger="worker.concerns.lease"):
        lease.release()
    assert "not released" in caplog.text


def test_the_requeue_cap_lets_lease_waits_outlast_the_longest_job() -> None:
    # Lease waits come every LEASE_RETRY_S while another run holds the job
    for limit in (60, 3600, 6 * 3600):
        s = Settings(max_time_limit_s=limit)
        assert s.requeue_limit == limit // LEASE_RETRY_S + 100
        assert s.requeue_limit * LEASE_RETRY_S > limit
    assert Settings(max_requeues=7).requeue_limit == 7


def test_a_lease_is_taken_once_redis_answers_again(tmp_path: Path) -> None:
    # Given a Redis that is down when the run starts (a failover under way) and answers 1 s on
    server = RedisServer(require_binary("redis-server", REDIS_INSTALL), tmp_path)
    client = redis.Redis(host="127.0.0.1", port=server.port, socket_connect_timeout=0.5,
                         socket_timeout=1)
    job = _job()
    lease = JobLease(client, job, "gpu0@a")
    got: list[tuple[bool, float]] = []
    t0 = time.monotonic()
    # When the run takes its lease, it waits the outage out instead of failing the job
    taker = threading.Thread(target=lambda: got.append((lease.acquire(), time.monotonic())))
    taker.start()
    try:
        time.sleep(1.0)
        server.start()  # from this thread: the server dies with the thread that started it
        taker.join(FAILOVER_S)
        ((taken, at),) = got
        assert taken and 0.9 < at - t0 < FAILOVER_S
        assert client.get(f"framefleet:lease:{job}") == lease.token.encode()
        # and a take whose reply was lost (the lease is already ours) is granted, not waited on
        assert lease._take(LEASE_TTL_S * 1000)
        lease.release()
    finally:
        taker.join(FAILOVER_S)
        server.stop()


def test_through_failover_gives_up_after_its_limit() -> None:
    calls = []

    def down() -> None:
        calls.append(time.monotonic())
        raise redis.exceptions.ConnectionError("refused")

    t0 = time.monotonic()
    with pytest.raises(redis.exceptions.ConnectionError):
        through_failover(down, "test", limit_s=1.0)
    assert len(calls) >= 3 and time.monotonic() - t0 < 2.5
