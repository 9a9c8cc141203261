"""Chaos: the Redis primary is SIGKILLed mid-job and with jobs queued, in the two shapes a
deployment fails over in.

- ``sentinel``: a primary, one replica and a Sentinel trio (quorum 2), as the compose profile
  and the Kubernetes overlay ship it (``tests/services/sentinel.py``); the workers and the
  client reach Redis only through ``sentinel://`` URLs.
- ``endpoint``: one address that moves to the promoted replica, as ElastiCache Multi-AZ moves
  its primary endpoint (``tests/services/endpoint.py``: a loopback TCP proxy, switched by a
  watcher that promotes the replica); the fleet has a plain ``redis://`` URL.
  ``endpoint-slow`` switches 12 s after the primary stopped answering, longer than a job lease
  and the host-loss sweep's grace: no running job may be taken for lost.

Each case kills the primary by PID, then measures the time until the fleet consumes again (a
job submitted after the kill is received by a worker), counts the jobs lost (goal: none), and
asserts every job ends in SUCCESS from exactly one successful execution, which the client's
``wait`` (as ``framefleet wait`` runs it) sees through the failover.

Lost messages come back through the lost-message reconciler (``worker.lifecycle.reconcile``),
here after 5 s instead of 30. Each case runs ``RUNS`` times in a row (``make chaos``: 20; set
FRAMEFLEET_CHAOS_RUNS to change it).

It runs under ``make chaos`` (FRAMEFLEET_CHAOS_FULL=1) only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from producer.client import Client
from producer.errors import BrokerError
from producer.settings import Settings
from tests.e2e.chaos_helpers import (
    CHAOS_ENV,
    FULL,
    LONG_JOB,
    RUNS,
    SMALL_JOB,
    Jobs,
    assert_exactly_once,
    count,
    mid_job,
    received,
    received_at,
    wait_for,
)
from tests.require import require_binary
from tests.services import REDIS_INSTALL, SentinelGroup, SwitchingEndpoint, WorkerProcess

# Asynchronous replication may drop what the primary acknowledged in its last moment (a queued
# message, say): a rare lost job is what the test measures, so it runs under `make chaos`, where
# a loss is reported and looked at, and not in every `make test`.
pytestmark = [pytest.mark.chaos, pytest.mark.e2e,
              pytest.mark.skipif(not FULL, reason="make chaos only (FRAMEFLEET_CHAOS_FULL=1)")]

#: Bounds on what a failover may cost on loopback (the primary is declared down after 1 s):
#: the fleet consumes again within this many seconds of the promotion...
CONSUMING_AGAIN_S = 30.0
#: ... and every job is done within this many seconds of the kill.
ALL_DONE_S = 120.0 if FULL else 50.0
#: How long the switching endpoint's service takes, once the primary is down, to promote the
#: replica and move the address to it (ElastiCache takes longer; the slow case covers a lease).
SWITCH_AFTER_S = {"endpoint": 1.0, "endpoint-slow": 12.0}

Group = SentinelGroup | SwitchingEndpoint


@pytest.fixture(params=["sentinel", "endpoint", "endpoint-slow"])
def group(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Group]:
    """The Redis servers of this test in one failover shape; requested before
    ``worker_factory``, so the workers stop before they do."""
    binary = require_binary("redis-server", REDIS_INSTALL)
    shape = str(request.param)
    servers: Group = (
        SentinelGroup(binary, tmp_path / "redis", sentinels=3) if shape == "sentinel"
        else SwitchingEndpoint(binary, tmp_path / "redis", down_after_s=1.0,
                               switch_after_s=SWITCH_AFTER_S[shape]))
    servers.start()
    try:
        yield servers
    finally:
        servers.stop()


def fleet_env(group: Group) -> dict[str, str]:
    return {**CHAOS_ENV, "FRAMEFLEET_BROKER_URL": group.url(),
            "FRAMEFLEET_RESULT_BACKEND": group.url(), "FRAMEFLEET_RECONCILE_AFTER_S": "5",
            **group.env()}


def fleet_client(group: Group) -> Client:
    settings = Settings(broker_url=group.url(),
                        sentinel_master=group.env().get("FRAMEFLEET_SENTINEL_MASTER"),
                        max_time_limit_s=60, visibility_timeout_s=61)
    return Client(settings=settings)


def submit_until_accepted(jobs: Jobs, job_id: str, uri: str, shape: dict[str, int],
                          timeout: float) -> float:
    """Submit, retrying while Redis has no primary; return the unix time it was accepted."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            jobs.submit(job_id, uri, shape)
            return time.time()
        except BrokerError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class Waiter(threading.Thread):
    """``JobHandle.wait`` (what ``framefleet wait`` runs) of one job, in a thread started
    before the kill: it must ride through the failover and return the result."""

    def __init__(self, jobs: Jobs, job_id: str) -> None:
        super().__init__(daemon=True)
        self.handle, self.result, self.error = jobs.handles[job_id], None, None

    def run(self) -> None:
        try:
            self.result = self.handle.wait(timeout=ALL_DONE_S, poll_s=0.2)
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.error = e

    def outcome(self) -> str:
        self.join(timeout=30)
        return "SUCCESS" if self.result is not None else f"no result: {self.error!r}"


def kill_primary(group: Group) -> tuple[float, float]:
    """SIGKILL the primary by PID; return the kill's unix time and the seconds until the
    replica was promoted (the Sentinels name it, or the address leads to it)."""
    pid = group.primary.pid
    group.primary.kill()
    killed = time.time()
    promoted = group.wait_promoted(30)
    print(f"failover: primary (pid {pid}) SIGKILLed; replica promoted {promoted:.1f} s later")
    return killed, promoted


def consuming_again(jobs: Jobs, workers: list[WorkerProcess], uri: str, killed: float) -> float:
    """Submit a probe job now and return the seconds from ``killed`` until a worker took it."""
    submit_until_accepted(jobs, "probe", uri, SMALL_JOB, CONSUMING_AGAIN_S)
    taken = wait_for(lambda: received_at(workers, "probe"), CONSUMING_AGAIN_S,
                     "probe job received after the failover")
    return taken[0] - killed


def sweep_requeues(workers: list[WorkerProcess]) -> int:
    """Jobs the host-loss sweep requeued. No worker dies here, but one whose connection broke
    may drop a message it had received and not started (Celery forgets its reserved requests
    on a lost connection, and kombu cannot restore them to a dead primary): the sweep brings
    such a message back, which is right. A running job requeued would be wrong."""
    return sum(w.log_text().count(" requeued by ") for w in workers)


def resent(workers: list[WorkerProcess]) -> int:
    """Jobs the lost-message reconciler sent again (their message was lost in the failover)."""
    return sum(w.log_text().count(" sent again by ") for w in workers)


def lost_jobs(jobs: Jobs, workers: list[WorkerProcess], timeout: float) -> list[str]:
    """The jobs that did not reach SUCCESS within ``timeout`` s (a lost message, claim or
    result), each printed with its state and how often a worker received it."""
    deadline = time.monotonic() + timeout
    pending = set(jobs.specs)
    metas: dict[str, dict[str, Any]] = {}
    while pending and time.monotonic() < deadline:
        metas = jobs.metas(sorted(pending))
        pending = {j for j, m in metas.items() if m.get("status") != "SUCCESS"}
        time.sleep(0.2)
    for job_id in sorted(pending):
        print(f"failover: {job_id} not done: {metas.get(job_id, {}).get('status')}, received "
              f"{received(workers, job_id)} times")
    return sorted(pending)


@pytest.mark.timeout(300 if FULL else 150)
@pytest.mark.parametrize("run", range(RUNS))
def test_primary_killed_mid_job(
    run: int, group: Group, worker_factory: Any, s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    # Given two workers on the Redis primary, one of them in the middle of a long job
    # that `framefleet wait` follows
    workers = worker_factory(2, env=fleet_env(group))
    jobs = Jobs(fleet_client(group), s3, s3_bucket)
    uri = jobs.put_input("long", LONG_JOB)
    small = jobs.put_input("small", SMALL_JOB)
    jobs.submit("long-0", uri, LONG_JOB)
    waiter = Waiter(jobs, "long-0")
    waiter.start()
    wait_for(partial(mid_job, jobs, ["long-0"], at_least=0.1), 60, "long-0 mid-way")
    # When the primary is SIGKILLed
    killed, promoted = kill_primary(group)
    # Then the fleet consumes again on the promoted replica, on its own
    again = consuming_again(jobs, workers, small, killed)
    # and the running job finishes exactly once, as `framefleet wait` sees
    lost = lost_jobs(jobs, workers, ALL_DONE_S)
    done = time.time() - killed
    print(f"failover mid-job: promoted after {promoted:.1f} s, consuming again after "
          f"{again:.1f} s, all done {done:.1f} s after the kill, jobs lost: {len(lost)}, "
          f"requeued by the sweep: {sweep_requeues(workers)}, leases taken again: "
          f"{sum(w.log_text().count('taken again') for w in workers)}")
    assert not lost
    assert sweep_requeues(workers) == 0  # the running job was never taken for lost
    results = jobs.wait_all(timeout=30)
    assert waiter.outcome() == "SUCCESS"
    assert again - promoted < CONSUMING_AGAIN_S
    assert_exactly_once(jobs, results, workers, tmp_path, verify=["long-0"])


@pytest.mark.timeout(300 if FULL else 150)
@pytest.mark.parametrize("run", range(RUNS))
def test_primary_killed_with_jobs_queued(
    run: int, group: Group, worker_factory: Any, s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    # Given a queue of small jobs, and two workers taking them one by one
    n = count(8, 20)
    workers = worker_factory(2, env=fleet_env(group))
    jobs = Jobs(fleet_client(group), s3, s3_bucket)
    uri = jobs.put_input("small", SMALL_JOB)
    for i in range(n):
        jobs.submit(f"queued-{i}", uri, SMALL_JOB)
    waiter = Waiter(jobs, f"queued-{n - 1}")
    waiter.start()
    # When the primary is SIGKILLed once the first jobs are done
    wait_for(lambda: len(jobs.metas(list(jobs.specs))) and sum(
        m.get("status") == "SUCCESS" for m in jobs.metas(list(jobs.specs)).values()) >= 2,
        60, "two jobs done")
    killed, promoted = kill_primary(group)
    # Then the fleet consumes again, and every queued job runs, exactly once
    again = consuming_again(jobs, workers, uri, killed)
    lost = lost_jobs(jobs, workers, ALL_DONE_S)
    done = time.time() - killed
    print(f"failover with {n} queued: promoted after {promoted:.1f} s, consuming again after "
          f"{again:.1f} s, all done {done:.1f} s after the kill, jobs lost: {len(lost)} "
          f"{lost}, requeued by the sweep: {sweep_requeues(workers)}, sent again by the "
          f"reconciler: {resent(workers)}")
    assert not lost
    results = jobs.wait_all(timeout=30)
    assert waiter.outcome() == "SUCCESS"
    assert again - promoted < CONSUMING_AGAIN_S
    assert_exactly_once(jobs, results, workers, tmp_path, verify=[])
