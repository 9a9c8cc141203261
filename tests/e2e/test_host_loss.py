"""Chaos: a host dies mid-job (its launcher and every process of it SIGKILLed together); the
job runs again on another host within 120 s, while the Redis visibility timeout stays long.

The surviving workers' host-loss sweep (``worker/lifecycle/recovery.py``) finds the message
the dead host held unacknowledged, once its lease has expired and nobody touched it for the
grace period, and requeues it exactly once. ``make test`` runs one host loss, ``make chaos``
(FRAMEFLEET_CHAOS_FULL=1) ten.
"""

from __future__ import annotations

import itertools
import signal
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis

from producer.app import TASK_NAME, redis_priority
from producer.client import Client, JobHandle
from producer.control import flags_for
from tests.e2e.chaos_helpers import (
    CHAOS_ENV,
    FULL,
    LONG_JOB,
    Jobs,
    assert_broker_drained,
    assert_exactly_once,
    count,
    mid_job,
    received,
    redelivered_after,
    succeeded,
    wait_for,
)
from tests.e2e.helpers import pattern_spec
from tests.e2e.hosts import Host

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]

#: The visibility timeout stays 6 h 15 min, its default for 6 h jobs: only the sweep can
#: bring the job back within the test. A short sweep keeps the test's wall time small.
RECOVERY_ENV = {
    **CHAOS_ENV,
    "FRAMEFLEET_MAX_TIME_LIMIT_S": "21600",
    "FRAMEFLEET_VISIBILITY_TIMEOUT_S": "22500",
    "FRAMEFLEET_RECOVERY_PERIOD_S": "1",
    "FRAMEFLEET_RECOVERY_GRACE_S": "3",
}
RECOVERY_LIMIT_S = 120


@pytest.fixture
def client(redis_url: str) -> Client:
    redis.Redis.from_url(redis_url).flushdb()
    return Client(broker_url=redis_url, backend_url=redis_url)


@pytest.fixture
def hosts(tmp_path: Path, worker_env: dict[str, str]) -> Iterator[Callable[[int], list[Host]]]:
    """``start(n)``: start ``n`` hosts (launchers), wait until their workers are ready."""
    started: list[Host] = []
    names = itertools.count()

    def start(n: int) -> list[Host]:
        new = [Host(f"host{next(names)}", tmp_path / "hosts", {**worker_env, **RECOVERY_ENV})
               for _ in range(n)]
        for h in new:
            h.start()
            started.append(h)
        for h in new:
            h.wait_ready()
        return new

    try:
        yield start
    finally:
        for h in started:
            h.terminate()
        for h in started:
            h.stop(timeout=20)


@pytest.mark.timeout(1500 if FULL else 400)
def test_host_loss_mid_job_runs_again_on_another_host_within_two_minutes(
    client: Client, hosts: Callable[[int], list[Host]], s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    rounds = count(1, 10)
    jobs = Jobs(client, s3, s3_bucket)
    uri = jobs.put_input("long", LONG_JOB)
    alive = hosts(2)
    everyone = list(alive)
    delays: list[float] = []
    for i in range(rounds):
        # Given two hosts, one of them running a job
        job_id = f"host-loss-{i}"
        jobs.submit(job_id, uri, LONG_JOB)
        _, p = wait_for(partial(mid_job, jobs, [job_id], at_least=(i % 3) / 4), 120,
                        f"{job_id} mid-way")
        node = str(jobs.meta(job_id)["worker"])
        dead = next(h for h in alive if h.nodename == node)
        # When that host dies: launcher, worker and pool process SIGKILLed together
        dead.kill(signal.SIGKILL)
        killed = time.time()
        alive.remove(dead)
        print(f"chaos: {dead.host} lost at {p.frames_done}/{p.frames_total} frames of {job_id}")
        if FULL and i < rounds - 1:
            alive += hosts(1)  # the autoscaler's replacement, for the next round
            everyone.append(alive[-1])
        # Then the job is delivered again, to another host, within two minutes
        seen: set[str] = set()
        handle = jobs.handles[job_id]

        def redelivered(handle: JobHandle = handle, job_id: str = job_id,
                        seen: set[str] = seen) -> bool:
            seen.add(handle.status())  # REQUEUED lasts until the next worker starts it
            return received(everyone, job_id) >= 2

        wait_for(redelivered, RECOVERY_LIMIT_S, f"redelivery of {job_id}", interval=0.05)
        delays.append(redelivered_after(everyone, job_id, killed))
        assert delays[-1] < RECOVERY_LIMIT_S
        result = jobs.handles[job_id].wait(timeout=120, poll_s=0.1)
        assert result.worker.node != dead.nodename
        assert succeeded(everyone, job_id) == 1
        assert any(f"job {job_id} requeued by" in h.log_text() for h in alive), "no sweep log"
        print(f"chaos: {job_id} delivered again {delays[-1]:.1f} s after the loss, to "
              f"{result.worker.node}; states seen: {sorted(seen)}")
    # and every job succeeded exactly once, with all its frames, leaving no message behind
    results = jobs.wait_all(timeout=60)
    assert_exactly_once(jobs, results, everyone, tmp_path)
    assert_broker_drained(client.app.conf.broker_url)
    print(f"chaos: {rounds} host losses, delivered again after {min(delays):.1f}-"
          f"{max(delays):.1f} s (limit {RECOVERY_LIMIT_S} s, visibility timeout 22500 s)")


@pytest.mark.timeout(300)
def test_a_live_worker_waiting_for_a_countdown_keeps_its_message(
    client: Client, worker_factory: Any, s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    """Held unacknowledged, without a lease, well past the grace period: not requeued, since
    its live worker touches it every period."""
    (worker,) = worker_factory(1, env=RECOVERY_ENV)
    jobs = Jobs(client, s3, s3_bucket)
    uri = jobs.put_input("long", LONG_JOB)
    spec = pattern_spec("countdown", uri, s3_bucket,
                        segment_frames=LONG_JOB["segment_frames"], time_limit_s=50)
    assert flags_for(client.app).claim(spec.job_id, spec.digest()) is None
    client.app.send_task(TASK_NAME, args=[spec.model_dump(mode="json")], task_id=spec.job_id,
                         priority=redis_priority(spec.priority), countdown=10)
    jobs.specs[spec.job_id], jobs.handles[spec.job_id] = spec, client.get(spec.job_id)
    results = jobs.wait_all(timeout=120)
    assert received([worker], "countdown") == 1
    assert "requeued by" not in worker.log_text()
    assert_exactly_once(jobs, results, [worker], tmp_path)
    assert_broker_drained(client.app.conf.broker_url)
