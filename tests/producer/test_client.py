"""Client behaviour against a real Redis, no worker."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from producer.client import Client
from producer.spec import JobSpec
from worker.ops.exporter import queue_depth


def _spec(job_id: str) -> JobSpec:
    return JobSpec.model_validate({"job_id": job_id, "input": {"uri": "s3://b/z.npy"},
                                   "decoder": {"weights": "random"},
                                   "output": {"uri": "s3://b/out"}})


def test_failed_publish_frees_the_job_id(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    redis.Redis.from_url(redis_url).flushdb()
    client = Client(broker_url=redis_url, backend_url=redis_url)

    def broken(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("broker went away")

    # Given a publish that fails after the job_id was claimed
    monkeypatch.setattr(client.app, "send_task", broken)
    with pytest.raises(ConnectionError):
        client.submit(_spec("lost-1"))
    monkeypatch.undo()
    # When the same job is submitted again, it is really queued this time
    client.submit(_spec("lost-1"))
    assert queue_depth(redis_url) == 1


def test_submit_clears_a_stale_cancel_flag(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    r.flushdb()
    client = Client(broker_url=redis_url, backend_url=redis_url)
    r.set("framefleet:cancel:fresh-1", "1")
    client.submit(_spec("fresh-1"))
    assert not r.exists("framefleet:cancel:fresh-1")
    assert r.get("framefleet:spec:fresh-1") == _spec("fresh-1").digest().encode()
