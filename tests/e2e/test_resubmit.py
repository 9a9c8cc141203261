"""A resubmit after the job's result expired: it runs again (returning the stored output as
``reused``) instead of staying PENDING for ever.

Real Redis, SeaweedFS and a Celery worker whose results live the shortest time settings allow
(``FRAMEFLEET_RESULT_EXPIRES_S=60``), so the test waits about a minute for the expiry.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis

from producer.client import Client
from tests.e2e.chaos_helpers import CHAOS_ENV, SMALL_JOB, Jobs, received, wait_for
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
    uri = jobs.put_input("small", SMALL_JOB)
    first = jobs.submit("expires", uri, SMALL_JOB).wait(timeout=60)
    result_key = client.app.backend.get_key_for_task("expires")
    assert 0 < r.ttl(result_key) <= EXPIRES_S
    # When its result has expired (its job_id claim has not: it lives 30 days)
    wait_for(lambda: not r.exists(result_key), EXPIRES_S + 30, "expiry of the result")
    assert r.exists("framefleet:spec:expires")
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
