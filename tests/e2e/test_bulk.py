"""Jobs submitted in bulk run on a real worker like any other (issue 54, point 13): the messages
``Client.submit_many`` batches are the worker's to take, each job ends with its output, and a
job submitted again in bulk after it succeeded is the same job, not a second run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis

from producer.client import Client
from tests.e2e.helpers import pattern_spec, put_latents, verify_output
from tests.services import S3Server

pytestmark = pytest.mark.e2e


def test_bulk_submitted_jobs_run_to_their_outputs(
        worker_factory: Any, s3: S3Server, s3_bucket: str, redis_url: str,
        tmp_path: Path) -> None:
    redis.Redis.from_url(redis_url).flushdb()
    worker_factory(1)
    uri = put_latents(s3, s3_bucket, "in/z.safetensors", latent_frames=3)
    specs = [pattern_spec(f"bulk-{i}", uri, s3_bucket, tenant="acme") for i in range(4)]
    client = Client(broker_url=redis_url, backend_url=redis_url)
    out = client.submit_many(specs)
    assert all(o.ok for o in out), [o.error for o in out]
    for o in out:
        assert o.handle is not None
        result = o.handle.wait(timeout=120)
        assert result.manifest.job_id == o.spec.job_id and not result.reused
        assert verify_output(s3, s3_bucket, result, tmp_path) == list(range(9))
    # Submitted again in bulk: the jobs that succeeded, found, nothing sent
    again = client.submit_many(specs)
    assert [o.handle.key for o in again if o.handle] == [o.spec.key for o in out]
    assert all(client.state(o.spec.job_id, "acme").state == "SUCCESS" for o in again)
    r = redis.Redis.from_url(redis_url)
    assert sum(r.llen(k) for k in r.scan_iter(match="video*") if r.type(k) == b"list") == 0
