"""Tenant-scoped job ids, black-box: two tenants use one job_id through real workers, each sees
only its own job, and a raw message under one tenant's key cannot overwrite its result."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import redis

from producer.app import TASK_NAME
from producer.client import Client
from producer.errors import JobCancelled, JobFailed
from producer.wire.spec import JobResult, VideoSpec
from tests.e2e.helpers import pattern_spec, put_latents, verify_output
from tests.waiting import wait_for

pytestmark = pytest.mark.e2e


def test_two_tenants_with_one_job_id_each_see_only_their_own(
    redis_url: str, worker_factory: Any, s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    redis.Redis.from_url(redis_url).flushdb()
    client = Client(broker_url=redis_url, backend_url=redis_url)
    worker_factory(2)
    uri = put_latents(s3, s3_bucket, "in/t.safetensors", latent_frames=3)
    # Given acme and evil, both submitting the job_id "shared-id" with different specs
    acme = pattern_spec("shared-id", uri, s3_bucket, tenant="acme")
    evil = pattern_spec("shared-id", uri, s3_bucket, segment_frames=4, tenant="evil")
    handles = {spec.tenant: client.submit(spec) for spec in (evil, acme)}
    # When both run (neither submit is a conflict)
    results = {t: h.wait(timeout=120) for t, h in handles.items()}
    # Then each tenant's id names its own job, output and digest
    for spec in (acme, evil):
        own = client.get("shared-id", tenant=spec.tenant).result()
        assert own.manifest.tenant == spec.tenant
        assert own.manifest.spec_digest == spec.digest()
        assert f"/{spec.tenant}/shared-id/" in own.manifest_uri
        (tmp_path / spec.tenant).mkdir()
        verify_output(s3, s3_bucket, results[spec.tenant], tmp_path / spec.tenant)
    assert acme.digest() != evil.digest()
    # a third tenant knows nothing of either, and the default tenant neither
    assert client.state("shared-id", tenant="other").state == "UNKNOWN"
    assert client.state("shared-id").state == "UNKNOWN"
    # evil's cancel of "shared-id" touches its own finished job only
    assert client.cancel("shared-id", tenant="evil") == "SUCCESS"
    assert client.state("shared-id", tenant="acme").state == "SUCCESS"


def test_a_raw_message_under_another_tenants_key_overwrites_nothing(
    redis_url: str, worker_factory: Any, s3: Any, s3_bucket: str
) -> None:
    redis.Redis.from_url(redis_url).flushdb()
    client = Client(broker_url=redis_url, backend_url=redis_url)
    (worker,) = worker_factory(1)
    uri = put_latents(s3, s3_bucket, "in/v.safetensors", latent_frames=2)
    victim = pattern_spec("report", uri, s3_bucket, tenant="acme")
    done = client.submit(victim).wait(timeout=120)
    # When evil sends its own spec (another job_id) under acme's task id, past the client
    attack = pattern_spec("mine", uri, s3_bucket, tenant="evil").model_dump(mode="json")
    client.app.send_task(TASK_NAME, args=[attack], task_id=victim.key)
    deadline = time.monotonic() + 60
    while victim.key not in worker.log_text() or "dropped" not in worker.log_text():
        assert time.monotonic() < deadline, worker.log_text()[-3000:]
        time.sleep(0.2)
    # Then acme's result is still acme's, evil's job never ran, nothing was written for it
    kept: JobResult = client.get("report", tenant="acme").result()
    assert kept.manifest.spec_digest == victim.digest() == done.manifest.spec_digest
    assert client.state("mine", tenant="evil").state == "UNKNOWN"
    listed = s3.client().list_objects_v2(Bucket=s3_bucket, Prefix="out/evil/")
    assert listed.get("KeyCount", 0) == 0
    # and the worker goes on to the next job
    assert client.submit(pattern_spec("next", uri, s3_bucket, tenant="evil")).wait(timeout=120)
    assert worker.running


def _dropped(worker: Any) -> int:
    return worker.log_text().count("dropped, nothing stored")


def test_a_tampered_message_locks_no_finished_job(
    redis_url: str, worker_factory: Any, s3: Any, s3_bucket: str
) -> None:
    """A raw message aimed at acme's FAILED, SUCCESS and REVOKED jobs changes none of them:
    nothing is stored under their keys (no STARTED, no time limit's FAILURE), and acme's
    identical resubmit of the failed and the cancelled job runs them."""
    r = redis.Redis.from_url(redis_url)
    r.flushdb()
    client = Client(broker_url=redis_url, backend_url=redis_url)
    (worker,) = worker_factory(1, env={"FRAMEFLEET_DEVICE": "cpu", "OMP_NUM_THREADS": "1"})
    small = put_latents(s3, s3_bucket, "in/small.safetensors", latent_frames=2)
    long = put_latents(s3, s3_bucket, "in/long.safetensors", latent_frames=60, h=48, w=64)
    # Given acme's three finished jobs: one failed (its input is missing), one succeeded and
    # one cancelled mid-way
    late = f"s3://{s3_bucket}/in/late.safetensors"
    failed = pattern_spec("failed", late, s3_bucket, tenant="acme")
    with pytest.raises(JobFailed, match="InputNotFoundError"):
        client.submit(failed).wait(timeout=120)
    done = pattern_spec("done", small, s3_bucket, tenant="acme")
    client.submit(done).wait(timeout=120)
    stopped = pattern_spec("stopped", long, s3_bucket, tenant="acme", segment_frames=4)
    handle = client.submit(stopped)
    while handle.status() != "PROGRESS":
        time.sleep(0.02)
    client.cancel(stopped.key)
    with pytest.raises(JobCancelled):
        handle.wait(timeout=120)
    stored = [f"celery-task-meta-{s.key}" for s in (failed, done, stopped)]
    before = r.mget(stored)
    # When evil sends, under each of their task ids, its own spec, the victim's job_id with
    # another spec, and a payload that is no spec at all, each with time limits of 1 ms (the
    # worker takes a job's limits from its spec, not from the message)
    seen = _dropped(worker)
    for victim in (failed, done, stopped):
        other = pattern_spec("mine", small, s3_bucket, tenant="evil")
        twin = victim.model_copy(update={"video": VideoSpec(segment_frames=3)})
        for payload in (other.model_dump(mode="json"), twin.model_dump(mode="json"),
                        {"hello": "world"}):
            client.app.send_task(TASK_NAME, args=[payload], task_id=victim.key,
                                 time_limit=0.001, soft_time_limit=0.001)
    wait_for(lambda: _dropped(worker) - seen >= 9, 60, "9 dropped messages")
    # Then every victim's stored result is exactly what it was: no STARTED, no FAILURE
    assert r.mget(stored) == before
    assert [client.state(s.key).state for s in (failed, done, stopped)] == [
        "FAILURE", "SUCCESS", "REVOKED"]
    # and acme's identical resubmits run the failed job (its input is there now) and the
    # cancelled one, while the succeeded one is returned as it is
    put_latents(s3, s3_bucket, "in/late.safetensors", latent_frames=2)
    assert client.submit(failed).wait(timeout=120).manifest.spec_digest == failed.digest()
    again = client.submit(stopped).wait(timeout=180)
    assert again.manifest.frames == 237 and not again.reused
    assert client.submit(done).wait(timeout=10).manifest.spec_digest == done.digest()
    assert worker.running and "Hard time limit" not in worker.log_text()
