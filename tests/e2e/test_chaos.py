"""Chaos: real Redis, SeaweedFS and Celery workers, with processes and servers killed mid-job.

``make test`` runs every case at reduced counts; ``make chaos`` (FRAMEFLEET_CHAOS_FULL=1) at full
counts. Each case asserts that every job ends in SUCCESS from exactly one successful execution
(a redelivered job may start twice), with a complete manifest and every frame index verified.

Workers run with the smallest delivery settings allowed (jobs up to 60 s, visibility timeout
61 s, see ``CHAOS_ENV``) so that a message a dead worker held comes back within the test.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis

from producer.client import Client
from tests.e2e.chaos_helpers import (
    CHAOS_ENV,
    FULL,
    LONG_JOB,
    SMALL_JOB,
    SWEEP_S,
    VISIBILITY_S,
    Jobs,
    assert_broker_drained,
    assert_exactly_once,
    count,
    kill_pool_child,
    mid_job,
    new_pool_child,
    pool_child,
    received,
    redelivered_after,
    retried,
    wait_for,
    wait_gone,
    wait_received,
)
from tests.services import RedisServer, S3Server, WorkerProcess, durable_redis

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]


@pytest.fixture
def client(redis_url: str) -> Client:
    redis.Redis.from_url(redis_url).flushdb()  # no job or unacked message of an earlier test
    return Client(broker_url=redis_url, backend_url=redis_url)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis of this test only, with every write fsynced to its AOF: it can be restarted.

    Requested before ``worker_factory``, so the workers stop before it does.
    """
    with durable_redis(tmp_path / "redis") as server:
        yield server


def redis_env(server: RedisServer) -> dict[str, str]:
    return {**CHAOS_ENV, "FRAMEFLEET_BROKER_URL": server.url,
            "FRAMEFLEET_RESULT_BACKEND": server.url}


def by_node(workers: list[WorkerProcess], node: str) -> WorkerProcess:
    return next(w for w in workers if w.nodename == node)


def spread(seconds: list[float]) -> str:
    return f"{min(seconds):.1f}-{max(seconds):.1f} s" if seconds else "-"


# 1. SIGKILL mid-job ------------------------------------------------------------------------


@pytest.mark.timeout(900 if FULL else 300)
def test_sigkill_pool_process_mid_job_redelivers_at_once(
    client: Client, worker_factory: Any, s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    # Given two workers
    kills = count(5, 20)
    workers = worker_factory(2, env=CHAOS_ENV)
    jobs = Jobs(client, s3, s3_bucket)
    uri = jobs.put_input("long", LONG_JOB)
    delays = []
    for i in range(kills):
        # When the pool process (ForkPoolWorker) running a job is SIGKILLed, after its first
        # chunk, a quarter or half of its frames (segments uploaded: the rerun overwrites them)
        job_id = f"child-{i}"
        jobs.submit(job_id, uri, LONG_JOB)
        _, p = wait_for(partial(mid_job, jobs, [job_id], at_least=(i % 3) / 4), 60,
                        f"{job_id} mid-way")
        worker = by_node(workers, str(jobs.meta(job_id)["worker"]))
        old = kill_pool_child(worker)
        killed = time.time()
        # Then Celery sees WorkerLostError and, with reject_on_worker_lost, requeues it at once
        wait_received(workers, job_id, 2, timeout=60)
        delays.append(redelivered_after(workers, job_id, killed))
        print(f"chaos: SIGKILL to the pool process running {job_id} at {p.frames_done}/"
              f"{p.frames_total} frames ({p.segments_done} segments); delivered again "
              f"{delays[-1]:.2f} s later")
        new_pool_child(worker, old)
    # and every job completes once, with all its frames
    results = jobs.wait_all(timeout=60 + 10 * kills)
    assert_exactly_once(jobs, results, workers, tmp_path)
    assert_broker_drained(client.app.conf.broker_url)
    lost = sum(w.log_text().count("WorkerLostError: Worker exited prematurely: signal 9")
               for w in workers)
    assert lost == kills
    print(f"chaos: {kills} pool-process kills, delivered again after {spread(delays)}")


@pytest.mark.timeout(1200 if FULL else 300)
def test_sigkill_worker_mid_job_redelivers_after_visibility_timeout(
    client: Client, worker_factory: Any, s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    """A host crash: SIGKILL to one worker's whole process group, and to the other's main
    process only, each in the middle of a job.

    Nothing rejects the messages: Redis holds them unacked until ``visibility_timeout`` after
    their delivery, and a worker's restore sweep then puts them back. Under ``make test`` the
    replacements start once that timeout has passed (a replacement host boots in about a
    minute) so their start-up sweep finds the orphans; under ``make chaos`` they start at once
    and the periodic sweep (every SWEEP_S) has to.
    """
    rounds = count(1, 10)
    jobs = Jobs(client, s3, s3_bucket)
    uri = jobs.put_input("long", LONG_JOB)
    everyone: list[WorkerProcess] = []
    killed: list[tuple[str, float]] = []
    n = 0
    for _ in range(rounds):
        # Given a host of two workers, each running a job
        host = worker_factory(2, env=CHAOS_ENV)
        everyone += host
        for _ in host:
            jobs.submit(f"crash-{n}", uri, LONG_JOB)
            n += 1
        running = []
        for w in host:
            job_id, p = wait_for(partial(mid_job, jobs, list(jobs.specs), w.nodename), 60,
                                 f"a job mid-way on {w.worker_name}")
            running.append((job_id, p))
        # When the host dies: one worker's process group is SIGKILLed, the other's main only
        orphan = pool_child(host[1])
        host[0].kill(signal.SIGKILL)
        host[1].kill(signal.SIGKILL, group=False)
        now = time.time()
        for (job_id, p), how in zip(running, ("process group", "main process"), strict=True):
            killed.append((job_id, now))
            print(f"chaos: SIGKILL to the {how} running {job_id} at "
                  f"{p.frames_done}/{p.frames_total} frames")
        # (Celery gives its pool processes a parent-death signal: none runs on unsupervised)
        wait_gone(orphan, timeout=10)
    last = killed[-1][1]
    if not FULL:
        # a replacement host comes up after the visibility timeout of the last orphan
        time.sleep(max(0.0, last + VISIBILITY_S + 1 - time.time()))
    started = time.time()
    everyone += worker_factory(2, env=CHAOS_ENV)
    # Then every job is delivered again and completes once, with all its frames
    results = jobs.wait_all(timeout=VISIBILITY_S + SWEEP_S + 60 + 10 * n)
    done = time.time()
    delays = [redelivered_after(everyone, job_id, at) for job_id, at in killed]
    assert_exactly_once(jobs, results, everyone, tmp_path)
    assert_broker_drained(client.app.conf.broker_url)
    print(f"chaos: {len(killed)} worker kills in {rounds} host crashes; replacements started "
          f"{started - last:.0f} s after the last; delivered again after {spread(delays)}; "
          f"all done {done - last:.0f} s after the last")


# 2. Redis restart --------------------------------------------------------------------------


@pytest.mark.timeout(900 if FULL else 300)
def test_redis_restart_with_jobs_queued(
    own_redis: RedisServer, worker_factory: Any, s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    # Given jobs queued in a Redis that keeps an append-only file
    n = count(6, 20)
    client = Client(broker_url=own_redis.url, backend_url=own_redis.url)
    jobs = Jobs(client, s3, s3_bucket)
    uri = jobs.put_input("long", LONG_JOB)
    for i in range(n):
        jobs.submit(f"queued-{i}", uri, LONG_JOB)
    # When Redis restarts (SIGTERM, then start on the same port and folder)
    up = own_redis.restart()
    # Then workers started afterwards run every job
    workers = worker_factory(2, env=redis_env(own_redis))
    jobs.wait_all(timeout=120 + 10 * n)
    # and workers connected, idle, while it restarts again reconnect and run more
    own_redis.restart()
    for i in range(n, n + 2):
        jobs.submit(f"queued-{i}", uri, LONG_JOB)
    results = jobs.wait_all(timeout=120)
    # each once, with all its frames, leaving no message behind
    assert_exactly_once(jobs, results, workers, tmp_path)
    assert_broker_drained(own_redis.url)
    print(f"chaos: redis restarted ({up:.2f} s) with {n} jobs queued, then with workers idle")


def drop_connections(server: RedisServer) -> None:
    """Close every client connection, as a network blip or a failover proxy does."""
    admin = redis.Redis.from_url(server.url)
    try:
        for kind in ("normal", "pubsub"):
            admin.client_kill_filter(_type=kind, skipme=True)
    finally:
        admin.close()


@pytest.mark.timeout(900 if FULL else 300)
@pytest.mark.parametrize("fault", ["down-2s", "drop"])
def test_redis_fault_with_jobs_running(
    fault: str, own_redis: RedisServer, worker_factory: Any, s3: Any, s3_bucket: str,
    tmp_path: Path,
) -> None:
    # Given two workers running jobs, with more queued behind them
    n, faults = count(6, 20), count(1, 3)
    client = Client(broker_url=own_redis.url, backend_url=own_redis.url)
    workers = worker_factory(2, env=redis_env(own_redis))
    jobs = Jobs(client, s3, s3_bucket)
    uri = jobs.put_input("long", LONG_JOB)
    for i in range(n):
        jobs.submit(f"redis-{i}", uri, LONG_JOB)
    for r in range(faults):
        # When Redis is down for 2 s, or drops every connection, in the middle of a job
        wait_for(lambda: mid_job(jobs, list(jobs.specs)), 120, "a job mid-way")
        if fault == "down-2s":
            own_redis.stop()
            time.sleep(2)
            own_redis.start()
        else:
            drop_connections(own_redis)
        print(f"chaos: redis {fault} {r + 1} of {faults} with jobs running")
    # Then every job completes once, with all its frames, leaving no message behind
    results = jobs.wait_all(timeout=120 + 10 * n)
    assert_exactly_once(jobs, results, workers, tmp_path)
    assert_broker_drained(own_redis.url)


# 3. S3 outage ------------------------------------------------------------------------------


@pytest.mark.timeout(900 if FULL else 300)
def test_s3_outage_mid_job_is_retried(
    client: Client, worker_factory: Any, s3: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    # Given a worker whose S3 client does not retry by itself (each failure reaches the task)
    rounds = count(1, 3)
    (worker,) = worker_factory(1, env={**CHAOS_ENV, "FRAMEFLEET_S3_MAX_ATTEMPTS": "1"})
    jobs = Jobs(client, s3, s3_bucket)
    uri = jobs.put_input("long", LONG_JOB)
    try:
        for r in range(rounds):
            job_id = f"s3-{r}"
            jobs.submit(job_id, uri, LONG_JOB)
            wait_for(partial(mid_job, jobs, [job_id]), 60, f"{job_id} mid-way")
            # When SeaweedFS is down for a few seconds in the middle of the job
            s3.stop()
            time.sleep(4)
            up = s3.start()
            jobs.handles[job_id].wait(timeout=120)
            # Then the job was retried (StorageError → Celery retry with back-off)
            tries = retried([worker], job_id)
            assert tries >= 1, worker.log_text()[-3000:]
            print(f"chaos: S3 down for 4 s + {up:.1f} s to come back during {job_id}; "
                  f"{tries} retries")
    finally:
        if not s3.running:
            s3.start()
    # and completed once, with all its frames
    results = jobs.wait_all(timeout=60)
    assert_exactly_once(jobs, results, [worker], tmp_path)
    assert_broker_drained(client.app.conf.broker_url)


# 4. Load -----------------------------------------------------------------------------------


@pytest.mark.timeout(1800 if FULL else 300)
def test_load_through_two_workers(
    client: Client, worker_factory: Any, s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    # Given two CPU workers and many small jobs of a few lengths
    n = count(40, 200)
    workers = worker_factory(2, env=CHAOS_ENV)
    jobs = Jobs(client, s3, s3_bucket)
    shapes = [{**SMALL_JOB, "latent_frames": t} for t in (4, 6, 9, 12)]
    uris = [jobs.put_input(f"small-{s['latent_frames']}", s) for s in shapes]
    # When they are all submitted at once
    t0 = time.monotonic()
    for i in range(n):
        jobs.submit(f"load-{i}", uris[i % len(uris)], shapes[i % len(shapes)])
    submitted = time.monotonic() - t0
    results = jobs.wait_all(timeout=60 + 3 * n)
    wall = time.monotonic() - t0
    # Then each was delivered once and succeeded once, with every frame in place (make test
    # decodes a sample of the videos; every manifest, listing, size and hash is checked)
    assert [j for j in jobs.specs if received(workers, j) != 1] == []
    sample = None if FULL else [f"load-{i}" for i in range(0, n, 4)]
    assert_exactly_once(jobs, results, workers, tmp_path, verify=sample)
    assert_broker_drained(client.app.conf.broker_url)
    # and both workers took part
    assert {r.worker.node for r in results.values()} == {w.nodename for w in workers}
    frames = sum(r.manifest.frames for r in results.values())
    print(f"chaos: {n} jobs ({frames} frames) submitted in {submitted:.1f} s, all done in "
          f"{wall:.1f} s ({n / wall:.1f} jobs/s) through 2 workers; frames decoded and checked "
          f"for {n if sample is None else len(sample)}, in {time.monotonic() - t0 - wall:.1f} s")
