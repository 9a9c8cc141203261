"""Requeues are not retries, end to end: a job that waited for its lease several times still
gets the whole retry budget for an S3 outage, as a fresh job does.

Real Redis, SeaweedFS and a Celery worker. Another run of the job holds its lease (the test
holds and renews it, under another node's name, as a worker still running a restored duplicate
would) for five looks of the worker, 5 s apart; then SeaweedFS goes down in the middle of the
run. The
retry budget (``FRAMEFLEET_RETRY_MAX=4``) is smaller than the number of lease waits: when
lease waits spent it, the job failed at the first S3 error.
"""

from __future__ import annotations

import os
import re
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis

from producer.client import Client
from tests.e2e.chaos_helpers import (
    CHAOS_ENV,
    LONG_JOB,
    Jobs,
    assert_broker_drained,
    assert_exactly_once,
    mid_job,
    wait_for,
)
from tests.services import S3Server
from worker.concerns.lease import LEASE_RETRY_S

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]

WAITS = 5
RETRY_MAX = 4
# Back-off 3, 6, 12, 24 s: the outage (a graceful stop, 2 s, a start that waits for a writable
# bucket) took 3-4 s on an idle machine, 14 s on a busy one and over 15 s once on a CI host.
BUDGET_S = 3 + 6 + 12 + 24


@pytest.mark.timeout(300)
def test_lease_waits_leave_the_retry_budget_whole(
    redis_url: str, worker_factory: Any, s3: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    # Given a worker with a retry budget of 4 (back-off 3, 6, 12, 24 s) whose S3 client does
    # not retry by itself, and a job whose lease another run holds for five looks
    r = redis.Redis.from_url(redis_url)
    r.flushdb()
    client = Client(broker_url=redis_url, backend_url=redis_url)
    (worker,) = worker_factory(1, env={
        **CHAOS_ENV, "FRAMEFLEET_S3_MAX_ATTEMPTS": "1", "FRAMEFLEET_RETRY_MAX": str(RETRY_MAX),
        "FRAMEFLEET_RETRY_BACKOFF_S": "3", "FRAMEFLEET_RETRY_BACKOFF_MAX_S": "24",
    })
    jobs = Jobs(client, s3, s3_bucket)
    uri = jobs.put_input("long", LONG_JOB)
    job_id = "waited"
    lease = f"framefleet:lease:{job_id}"
    r.set(lease, f"elsewhere@other {os.getpid()} held", px=10_000)
    jobs.submit(job_id, uri, LONG_JOB)

    def lease_waits() -> int:
        return len(re.findall(rf"\[{job_id}\] retry: Retry in {LEASE_RETRY_S}s$",
                              worker.log_text(), re.M))

    def held_for_five_looks() -> bool:
        r.pexpire(lease, 10_000)  # the other run renews its lease
        return lease_waits() >= WAITS

    wait_for(held_for_five_looks, 30 + WAITS * LEASE_RETRY_S, "five lease waits", 0.2)
    r.delete(lease)  # the other run ended
    try:
        # When the job runs at last, and SeaweedFS is down for a few seconds mid-job
        wait_for(partial(mid_job, jobs, [job_id]), 60 + WAITS * LEASE_RETRY_S,
                 f"{job_id} mid-way")
        down_at = time.monotonic()
        s3.stop()
        time.sleep(2)
        s3.start()
        outage = time.monotonic() - down_at
        result = jobs.handles[job_id].wait(timeout=120)
    finally:
        if not s3.running:
            s3.start()
    # Then it waited for the lease five times, and still retried the S3 errors to success
    log = worker.log_text()
    waits = lease_waits()
    errors = len(re.findall(rf"\[{job_id}\] retry: Retry in [\d.]+s: StorageError", log))
    print(f"requeues: {waits} lease waits, then {errors} retries of S3 errors (S3 down for "
          f"{outage:.1f} s, budget {BUDGET_S:.0f} s)")
    assert waits == WAITS, log[-3000:]
    assert 1 <= errors <= RETRY_MAX, log[-3000:]
    assert result.manifest.job_id == job_id
    assert_exactly_once(jobs, {job_id: result}, [worker], tmp_path)
    assert_broker_drained(redis_url)
