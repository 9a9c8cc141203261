"""A job that fails for good ends its live playlist, whatever decided the end, end to end.

Real Redis, SeaweedFS and Celery worker processes; the jobs are pattern decodes long enough to
have listed segments when their end comes. Each test drives one route to a final FAILURE and
then reads ``index.m3u8`` from the store: the segments it listed stay listed, ``EXT-X-ENDLIST``
is there once, and there is no ``manifest.json``. (The poison cap is in ``test_poison.py``.)

- the soft time limit (the job's ``time_limit_s``): ``SoftTimeLimitExceeded`` in the run;
- the hard time limit: Celery kills the pool process, and the worker's main process ends the
  playlist (in ``test_every_end.py``, with the end's ledger record and count);
- retries exhausted (``FRAMEFLEET_RETRY_MAX=0``): SeaweedFS goes down mid-job, so the end
  cannot be written at once either; it is, once SeaweedFS is back;
- the requeue cap (``FRAMEFLEET_MAX_REQUEUES=2``): the pool process is killed mid-job while
  another run (the test) holds the job's lease; the job fails after two lease waits, and its
  playlist is ended once that run lets the lease go, never before.
"""

from __future__ import annotations

import os
import re
import signal
import time
from functools import partial
from typing import Any

import pytest
import redis
from botocore.exceptions import BotoCoreError, ClientError

from producer.client import Client
from producer.errors import JobFailed
from producer.wire.spec import JobSpec, VideoSpec
from tests.e2e.chaos_helpers import CHAOS_ENV, Jobs, pool_child, wait_for
from tests.e2e.helpers import pattern_spec
from tests.services import S3Server

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]

#: 997 frames of 384x512 in 84 segments (the first of 1 frame): a 6-15 s decode on 2 cores,
#: whose first segments land in its first second.
SLOW_JOB = {"latent_frames": 250, "h": 48, "w": 64}


@pytest.fixture
def client(redis_url: str) -> Client:
    redis.Redis.from_url(redis_url).flushdb()
    return Client(broker_url=redis_url, backend_url=redis_url)


def slow_spec(jobs: Jobs, job_id: str, **kw: Any) -> JobSpec:
    uri = jobs.put_input("slow", SLOW_JOB)
    spec = pattern_spec(job_id, uri, jobs.bucket, **kw)
    return spec.model_copy(update={"video": VideoSpec(segment_frames=12, first_segment_frames=1)})


def playlist(jobs: Jobs, job_id: str) -> str | None:
    try:
        body = jobs.s3.client().get_object(Bucket=jobs.bucket,
                                           Key=f"out/default/{job_id}/index.m3u8")
    except (ClientError, BotoCoreError):  # not written yet, or the store is down
        return None
    return str(body["Body"].read().decode())


def listed(text: str | None) -> int:
    return len(re.findall(r"^segment-\d+\.mp4$", text or "", re.M))


def ended(jobs: Jobs, job_id: str) -> str | None:
    text = playlist(jobs, job_id)
    return text if text is not None and "#EXT-X-ENDLIST" in text else None


def final(jobs: Jobs, job_id: str, timeout: float) -> dict[str, Any]:
    return wait_for(lambda: (m := jobs.meta(job_id))["status"] in {"SUCCESS", "FAILURE"} and m,
                    timeout, f"end of {job_id}")


def assert_ended_early(jobs: Jobs, job_id: str, text: str) -> None:
    """Ended once, at the segments it listed, with no manifest (the output is incomplete)."""
    n = listed(text)
    assert 1 <= n < 84, text
    assert text.count("#EXT-X-ENDLIST") == 1 and text.endswith("#EXT-X-ENDLIST\n"), text
    objects = jobs.s3.client().list_objects_v2(Bucket=jobs.bucket,
                                               Prefix=f"out/default/{job_id}/")
    names = {o["Key"].rsplit("/", 1)[1] for o in objects["Contents"]}
    assert "manifest.json" not in names
    print(f"final playlist: {job_id}: {n} segments listed, then EXT-X-ENDLIST")


@pytest.mark.timeout(180)
def test_the_soft_time_limit_ends_the_playlist(
    client: Client, worker_factory: Any, s3: S3Server, s3_bucket: str
) -> None:
    # Given a job whose time limit (2 s) ends it mid-decode
    worker_factory(1, env=CHAOS_ENV)
    jobs = Jobs(client, s3, s3_bucket)
    handle = client.submit(slow_spec(jobs, "soft-limit", time_limit_s=2))
    meta = final(jobs, "soft-limit", 60)
    # Then it failed for its time limit, and its playlist is ended
    assert meta["status"] == "FAILURE", meta
    with pytest.raises(JobFailed, match="SoftTimeLimitExceeded"):
        handle.result()
    text = wait_for(partial(ended, jobs, "soft-limit"), 10, "ENDLIST")
    assert_ended_early(jobs, "soft-limit", text)


@pytest.mark.timeout(240)
def test_retries_exhausted_end_the_playlist_once_the_store_is_back(
    client: Client, worker_factory: Any, s3: S3Server, s3_bucket: str
) -> None:
    # Given a worker without retries (nor botocore's), and SeaweedFS going down mid-job
    worker_factory(1, env={**CHAOS_ENV, "FRAMEFLEET_RETRY_MAX": "0",
                           "FRAMEFLEET_S3_MAX_ATTEMPTS": "1"})
    jobs = Jobs(client, s3, s3_bucket)
    handle = client.submit(slow_spec(jobs, "no-retries", time_limit_s=50))
    wait_for(lambda: listed(playlist(jobs, "no-retries")) >= 2, 60, "two listed segments", 0.05)
    s3.stop()
    try:
        meta = final(jobs, "no-retries", 60)
        # Then it failed at the first S3 error
        assert meta["status"] == "FAILURE", meta
        with pytest.raises(JobFailed, match="StorageError"):
            handle.result()
    finally:
        s3.start()
    # and once the store answers again, its playlist is ended
    text = wait_for(partial(ended, jobs, "no-retries"), 60, "ENDLIST")
    assert_ended_early(jobs, "no-retries", text)


@pytest.mark.timeout(240)
def test_the_requeue_cap_ends_the_playlist_once_the_lease_is_free(
    client: Client, redis_url: str, worker_factory: Any, s3: S3Server, s3_bucket: str
) -> None:
    # Given a worker that requeues a job twice at most, and a job mid-decode
    (worker,) = worker_factory(1, env={**CHAOS_ENV, "FRAMEFLEET_MAX_REQUEUES": "2"})
    r = redis.Redis.from_url(redis_url)
    jobs = Jobs(client, s3, s3_bucket)
    handle = client.submit(slow_spec(jobs, "requeued", time_limit_s=50))
    wait_for(lambda: listed(playlist(jobs, "requeued")) >= 2, 60, "two listed segments", 0.05)
    # When another run holds its lease and the run under it dies (it comes back at once)
    lease = "framefleet:lease:requeued"
    r.set(lease, f"elsewhere@other {os.getpid()} held", px=10_000)
    os.kill(pool_child(worker).pid, signal.SIGKILL)

    def failed_while_held() -> dict[str, Any] | None:
        r.pexpire(lease, 10_000)  # the other run renews its lease
        meta = jobs.meta("requeued")
        return meta if meta["status"] == "FAILURE" else None

    try:
        meta = wait_for(failed_while_held, 60, "FAILURE", 0.2)
        # Then it fails after two lease waits, naming the cap
        with pytest.raises(JobFailed, match=r"requeued 2 times \(FRAMEFLEET_MAX_REQUEUES=2\)"):
            handle.result()
        assert meta["status"] == "FAILURE"
        # and its playlist stays open while the other run holds the lease
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            r.pexpire(lease, 10_000)
            assert ended(jobs, "requeued") is None
            time.sleep(0.2)
    finally:
        r.delete(lease)  # the other run ends
    # and is ended once that run let the lease go
    text = wait_for(partial(ended, jobs, "requeued"), 30, "ENDLIST")
    assert_ended_early(jobs, "requeued", text)
