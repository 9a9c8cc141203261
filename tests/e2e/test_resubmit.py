"""A resubmit after the job's result expired: it runs again (returning the stored output as
``reused``, or ending cancelled again) instead of staying PENDING for ever.

Real Redis, SeaweedFS and a Celery worker whose results live the shortest time settings allow
(``FRAMEFLEET_RESULT_EXPIRES_S=60``): the test checks the results' TTLs, then removes them as
their expiry would.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis

from producer.client import Client
from tests.e2e.chaos_helpers import CHAOS_ENV, LONG_JOB, Jobs, mid_job, received, wait_for
from tests.e2e.helpers import verify_output

pytestmark = [pytest.mark.e2e]

EXPIRES_S = 60


@pytest.mark.timeout(300)
def test_a_resubmit_after_the_result_expired_returns_the_stored_output(
    redis_url: str, worker_factory: Any, s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    # Given a job that succeeded on a worker whose results expire after a minute
    r = redis.Redis.from_url(redis_url)
    r.flushdb()
    client = Client(broker_url=redis_url, backend_url=redis_url)
    (worker,) = worker_factory(1, env={**CHAOS_ENV,
                                       "FRAMEFLEET_RESULT_EXPIRES_S": str(EXPIRES_S)})
    jobs = Jobs(client, s3, s3_bucket)
    uri = jobs.put_input("long", LONG_JOB)
    jobs.submit("expires", uri, LONG_JOB)
    # (and one cancelled while it waited behind it: the worker drops it when it comes)
    wait_for(partial(mid_job, jobs, ["expires"]), 60, "the first job mid-way")
    cancelled = jobs.submit("cancelled", uri, LONG_JOB)
    client.cancel("cancelled")
    first = jobs.handles["expires"].wait(timeout=60)
    wait_for(lambda: cancelled.status() == "REVOKED", 30, "the cancel")
    keys = [client.app.backend.get_key_for_task(j) for j in ("expires", "cancelled")]
    assert all(0 < r.ttl(key) <= EXPIRES_S for key in keys)
    # When their results have expired (their job_id claims have not: they live 30 days). The
    # TTLs above are the worker's setting; Redis's expiry removes the keys when they run out,
    # as this DEL does now (instead of waiting a minute for it)
    assert r.delete(*keys) == 2
    assert r.exists("framefleet:spec:expires", "framefleet:spec:cancelled") == 2
    assert client.get("expires").status() == "PENDING"
    # Then submitting the same spec again sends it, and the worker returns the stored output
    again = client.submit(jobs.specs["expires"]).wait(timeout=60)
    assert again.reused and not first.reused
    assert again.manifest == first.manifest and again.manifest_uri == first.manifest_uri
    assert received([worker], "expires") == 2
    verify_output(s3, s3_bucket, again, tmp_path)
    # and a resubmit of the finished job returns it without sending it a third time
    assert client.submit(jobs.specs["expires"]).wait(timeout=10) == again
    assert received([worker], "expires") == 2
    # The cancelled one is sent again too and, since resubmitting after a cancel means "run
    # it after all" (README), runs to a complete output rather than staying PENDING
    handle = client.submit(jobs.specs["cancelled"])
    rerun = handle.wait(timeout=90)
    verify_output(s3, s3_bucket, rerun, tmp_path)
    assert received([worker], "cancelled") == 2
