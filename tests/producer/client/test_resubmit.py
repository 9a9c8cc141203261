"""The client's resubmit of a known job_id against a real Redis, with no worker: what it sends.

A job a worker received and whose result has since expired (PENDING, with the run record's
"started" mark) is sent again; one that is still queued (PENDING, never received) is not.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import redis

from producer.app import QUEUE
from producer.client import Client
from producer.state.control import flags_for
from producer.wire.spec import DecoderSpec, InputSpec, JobSpec, OutputSpec


def _queued(r: redis.Redis, job_id: str) -> int:
    """Messages of ``job_id`` in the queue's priority lists."""
    return sum(json.loads(raw)["headers"]["id"] == job_id
               for key in r.scan_iter(match=f"{QUEUE}*") if r.type(key) == b"list"
               for raw in r.lrange(key, 0, -1))


def _spec(tmp_path: Path) -> JobSpec:
    return JobSpec(job_id=f"re-{secrets.token_hex(6)}", input=InputSpec(uri="s3://b/in.npy"),
                   decoder=DecoderSpec(weights="random"),
                   output=OutputSpec(uri=(tmp_path / "out").as_uri()))


def test_resubmit_sends_again_only_a_job_whose_result_expired(
    redis_url: str, tmp_path: Path
) -> None:
    r = redis.Redis.from_url(redis_url)
    r.flushdb()  # the queue holds only these jobs' messages: _queued reads it whole
    client = Client(broker_url=redis_url, backend_url=redis_url)
    queued, expired = _spec(tmp_path), _spec(tmp_path)
    try:
        # Given two submitted jobs: one still queued, one received by a worker whose result
        # has expired since (a worker marks a job when it receives it)
        for spec in (queued, expired):
            client.submit(spec)
        flags_for(client.app).mark_started(expired.job_id)
        assert client.get(expired.job_id).status() == "PENDING"
        # When both are submitted again, twice
        for _ in range(2):
            for spec in (queued, expired):
                client.submit(spec)
        # Then the queued one is not sent again, the expired one once
        assert _queued(r, queued.job_id) == 1
        assert _queued(r, expired.job_id) == 2
    finally:
        _drop(r, {queued.job_id, expired.job_id})


def _drop(r: redis.Redis, job_ids: set[str]) -> None:
    """Remove the messages of ``job_ids`` from the queue (no worker will take them)."""
    for key in r.scan_iter(match=f"{QUEUE}*"):
        if r.type(key) == b"list":
            for raw in r.lrange(key, 0, -1):
                if json.loads(raw)["headers"]["id"] in job_ids:
                    r.lrem(key, 0, raw)


def test_a_resubmit_after_failure_starts_with_no_worker_losses(
    redis_url: str, tmp_path: Path
) -> None:
    # Given a job that ended in FAILURE after its last run was killed without ending
    # (Celery's hard time limit), so its run record still names that run
    r = redis.Redis.from_url(redis_url)
    r.flushdb()
    client = Client(broker_url=redis_url, backend_url=redis_url)
    spec = _spec(tmp_path)
    flags = flags_for(client.app)
    try:
        client.submit(spec)
        _drop(r, {spec.job_id})  # (a worker took it)
        flags.mark_started(spec.job_id)
        flags.start_run(spec.job_id, "gpu0@a 1 t")
        client.app.backend.mark_as_failure(spec.job_id, TimeoutError("hard time limit"))
        # When it is submitted again
        client.submit(spec)
        # Then it is sent again, and its next run counts no loss
        assert _queued(r, spec.job_id) == 1
        assert flags.start_run(spec.job_id, "gpu0@a 2 t") == (0, None)
    finally:
        _drop(r, {spec.job_id})
