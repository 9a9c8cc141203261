"""Every final state gets one ledger record and one ``framefleet_jobs_total`` count, also the
ends decided outside a run's concerns, black-box through real Redis, SeaweedFS and a worker:

- Celery's hard time limit (decided in the worker's main process, which kills the pool
  process: the count lands on the pool process that replaces it, and the main process ends
  the live playlist);
- the requeue cap while another run holds the job's lease (``FRAMEFLEET_MAX_REQUEUES=2``);
- a spec the worker's rules refuse on receipt (an output outside its
  ``FRAMEFLEET_OUTPUT_PREFIX``; this producer sets none).

The routes through the concerns (success, failure, cancel, retries) are in ``test_ledger.py``.
"""

from __future__ import annotations

import os
import time
from functools import partial
from typing import Any

import pytest
import redis
from botocore.exceptions import BotoCoreError, ClientError

from producer.client import Client
from producer.errors import JobFailed
from producer.state import keys
from producer.wire.results import LedgerRecord
from producer.wire.spec import JobSpec, OutputSpec, VideoSpec
from tests.e2e.chaos_helpers import CHAOS_ENV, new_pool_child, pool_child, wait_for
from tests.e2e.helpers import pattern_spec, put_latents
from tests.services import free_port
from tests.worker.test_metrics import scrape, value

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]
JOBS = "framefleet_jobs_total"
#: The worker's FRAMEFLEET_HARD_LIMIT_AFTER_S here (60 by default: a minute of waiting).
HARD_LIMIT_AFTER_S = 8


def _records(s3: Any, bucket: str) -> list[LedgerRecord]:
    listed = s3.client().list_objects_v2(Bucket=bucket, Prefix="ledger/").get("Contents", [])
    return [LedgerRecord.model_validate_json(
        s3.client().get_object(Bucket=bucket, Key=o["Key"])["Body"].read()) for o in listed]


def ended(s3: Any, bucket: str, spec: JobSpec) -> str | None:
    """The job's playlist once it has its end tag."""
    try:
        body = s3.client().get_object(Bucket=bucket,
                                      Key=f"out/{spec.tenant}/{spec.job_id}/index.m3u8")
    except (ClientError, BotoCoreError):
        return None
    text = str(body["Body"].read().decode())
    return text if "#EXT-X-ENDLIST" in text else None


def _count(port: int, reason: str) -> float:
    try:
        return value(scrape(port), JOBS, status="failure", reason=reason, tenant="acme")
    except OSError:  # the pool process is being replaced
        return 0.0


def test_every_route_to_an_end_leaves_one_record_and_one_count(
    redis_url: str, worker_factory: Any, s3: Any, s3_bucket: str
) -> None:
    r = redis.Redis.from_url(redis_url)
    r.flushdb()
    client = Client(broker_url=redis_url, backend_url=redis_url)
    port = free_port()
    (worker,) = worker_factory(1, env={
        **CHAOS_ENV, "FRAMEFLEET_METRICS_PORT": str(port), "FRAMEFLEET_MAX_REQUEUES": "2",
        "FRAMEFLEET_HARD_LIMIT_AFTER_S": str(HARD_LIMIT_AFTER_S),
        "FRAMEFLEET_METRICS_TENANTS": "acme",
        "FRAMEFLEET_LEDGER_URI": f"s3://{s3_bucket}/ledger",
        "FRAMEFLEET_OUTPUT_PREFIX": f"s3://{s3_bucket}/out"})
    slow = put_latents(s3, s3_bucket, "in/slow.safetensors", latent_frames=250, h=48, w=64)
    small = put_latents(s3, s3_bucket, "in/small.safetensors", latent_frames=2)

    # Given a job (soft limit 2 s, hard 10 s) whose pool process stops mid-decode, as if stuck
    # in native code: the soft limit's signal waits, and no code of the run sees its end
    killed = pattern_spec("killed", slow, s3_bucket, tenant="acme", time_limit_s=2)
    killed = killed.model_copy(update={"video": VideoSpec(segment_frames=12,
                                                          first_segment_frames=1)})
    handle = client.submit(killed)
    child = pool_child(worker)
    wait_for(lambda: (p := handle.progress()) is not None and p.segments_done >= 1, 60,
             "a listed segment", 0.02)
    child.suspend()
    stopped_at = time.time()
    # Then Celery's hard limit kills it, in the worker's main process
    with pytest.raises(JobFailed, match="TimeLimitExceeded"):
        handle.wait(timeout=120)
    assert time.time() - stopped_at < 2 + HARD_LIMIT_AFTER_S + 10
    new_pool_child(worker, child.pid)
    # and the pool process that replaced it counts it, the ledger has its one record, and the
    # main process ends its live playlist
    wait_for(lambda: _count(port, "TimeLimitExceeded") == 1, 60, "the hard limit's count")
    (record,) = wait_for(lambda: _records(s3, s3_bucket), 30, "its ledger record")
    assert (record.key, record.status, record.reason) == (killed.key, "failure",
                                                          "TimeLimitExceeded")
    assert [s.state for s in record.states] == ["QUEUED", "STARTED", "FAILURE"]
    (held,) = record.held
    assert (held.status, held.reason) == ("failure", "TimeLimitExceeded")
    assert HARD_LIMIT_AFTER_S < held.gpu_seconds < HARD_LIMIT_AFTER_S + 30, held
    assert not r.hexists(keys.runs(killed.key), "running")  # no worker loss left behind
    playlist = wait_for(partial(ended, s3, s3_bucket, killed), 30, "the playlist's end")
    assert playlist.count("#EXT-X-ENDLIST") == 1 and "segment-00000.mp4" in playlist

    # Given a job whose lease another run holds all along
    held_elsewhere = pattern_spec("held", small, s3_bucket, tenant="acme", time_limit_s=50)
    lease = keys.lease(held_elsewhere.key)
    r.set(lease, f"elsewhere@other {os.getpid()} held", px=60_000)
    try:
        # When it is requeued twice, the cap
        with pytest.raises(JobFailed, match=r"requeued 2 times"):
            client.submit(held_elsewhere).wait(timeout=60)
    finally:
        r.delete(lease)
    # Then it is counted once and recorded once, with its requeues
    wait_for(lambda: _count(port, "FatalJobError") == 1, 30, "the requeue cap's count")
    records = wait_for(lambda: len(got := _records(s3, s3_bucket)) == 2 and got, 30, "2 records")
    (capped,) = [x for x in records if x.key == held_elsewhere.key]
    assert (capped.status, capped.reason, capped.requeues) == ("failure", "FatalJobError", 2)
    assert [s.state for s in capped.states] == ["QUEUED", "FAILURE"] and not capped.held

    # Given a spec this worker's rules refuse on receipt (the producer allowed it)
    refused = pattern_spec("refused", small, s3_bucket, tenant="acme", time_limit_s=50).model_copy(
        update={"output": OutputSpec(uri=f"s3://{s3_bucket}/elsewhere")})
    with pytest.raises(JobFailed, match="not under this fleet's output prefix"):
        client.submit(refused).wait(timeout=60)
    # Then it is counted under its tenant and recorded
    wait_for(lambda: _count(port, "InvalidJobError") == 1, 30, "the refusal's count")
    records = wait_for(lambda: len(got := _records(s3, s3_bucket)) == 3 and got, 30, "3 records")
    (no,) = [x for x in records if x.key == refused.key]
    assert (no.status, no.reason) == ("failure", "InvalidJobError")

    # And the worker goes on: one more job, one more record, and every count is still one
    fine = pattern_spec("fine", small, s3_bucket, tenant="acme", time_limit_s=50)
    client.submit(fine).wait(timeout=60)
    wait_for(lambda: len(_records(s3, s3_bucket)) == 4, 30, "4 records")
    samples = scrape(port)
    assert value(samples, JOBS, status="success", reason="", tenant="acme") == 1
    for reason in ("TimeLimitExceeded", "FatalJobError", "InvalidJobError"):
        assert value(samples, JOBS, status="failure", reason=reason, tenant="acme") == 1
    assert sorted(x.key for x in _records(s3, s3_bucket)) == sorted(
        [killed.key, held_elsewhere.key, refused.key, "acme:fine"])
