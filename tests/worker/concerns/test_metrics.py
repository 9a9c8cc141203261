"""JobMetrics: every run's end counted with its reason, its held time, and the queue wait."""

from __future__ import annotations

import secrets
import time
import types
from typing import Any

from producer import errors
from producer.app import ENQUEUED_AT_HEADER, make_app
from producer.cli.cost import read_held
from producer.settings import Settings
from producer.state.keys import HELD_PREFIX
from producer.wire.spec import (
    InputSpec,
    JobSpec,
    OutputSpec,
)
from worker.concerns.base import Failed
from worker.concerns.cancel import Revoked
from worker.concerns.metrics import JobMetrics
from worker.concerns.retries import Requeue, Retry
from worker.metrics import WORKER_REGISTRY
from worker.run import Run


def _metrics(app: Any, tenant: str, **request: Any) -> JobMetrics:
    """The concern for a run of a task stand-in: Celery's request fields the concern reads,
    a real app."""
    fields = {"retries": 0, "delivery_info": {}, "headers": None, "hostname": "gpu0@h",
              **request}  # fmt: skip
    task = types.SimpleNamespace(request=types.SimpleNamespace(**fields), app=app)
    spec = JobSpec(job_id=f"j-{secrets.token_hex(4)}", tenant=tenant,
                   input=InputSpec(uri="file:///in/z.npy"), output=OutputSpec(uri="file:///out"))
    settings = Settings(metrics_tenants=tenant)
    return JobMetrics(Run(spec=spec, settings=settings), task)  # type: ignore[arg-type]


def _waits(tenant: str) -> float:
    count = WORKER_REGISTRY.get_sample_value("framefleet_queue_wait_seconds_count",
                                             {"tenant": tenant})
    return count or 0.0


def test_queue_wait_is_observed_on_a_first_delivery_only() -> None:
    tenant = f"t{secrets.token_hex(4)}"
    stamp = {ENQUEUED_AT_HEADER: time.time() - 5}
    _metrics(None, tenant, headers=stamp)
    assert _waits(tenant) == 1
    sum_ = WORKER_REGISTRY.get_sample_value("framefleet_queue_wait_seconds_sum",
                                            {"tenant": tenant})
    assert sum_ is not None and 5 <= sum_ < 60
    # A retry carries the first stamp: its wait would include the first run. Not observed,
    # nor a redelivery, nor a message without a stamp (or with one that is not a number).
    _metrics(None, tenant, headers=stamp, retries=1)
    _metrics(None, tenant, headers=stamp, delivery_info={"redelivered": True})
    _metrics(None, tenant)
    _metrics(None, tenant, headers={ENQUEUED_AT_HEADER: "yesterday"})
    assert _waits(tenant) == 1


def test_retries_requeues_and_cancels_are_told_apart_and_leave_held_records(
    redis_url: str,
) -> None:
    tenant = f"t{secrets.token_hex(4)}"
    app = make_app(broker_url=redis_url, backend_url=redis_url)
    try:
        ends = [
            (Retry(error=errors.StorageError("503")), "retry", "StorageError"),
            (Requeue(error=errors.DeviceOutOfMemory("oom")), "requeue", "DeviceOutOfMemory"),
            (Revoked(error=errors.JobCancelled("by the client")), "cancelled", ""),
            (Failed(error=errors.InputNotFoundError("no such object")), "failure",
             "InputNotFoundError"),
        ]  # fmt: skip
        runs = []
        for outcome, _, _ in ends:
            concern = _metrics(app, tenant)
            concern.on_outcome(outcome)
            runs.append(concern.run.spec.job_id)
        sample = WORKER_REGISTRY.get_sample_value
        retries = "framefleet_job_retries_total"
        assert sample(retries, {"kind": "retry", "reason": "StorageError", "tenant": tenant}) == 1
        assert sample(retries, {"kind": "requeue", "reason": "DeviceOutOfMemory",
                                "tenant": tenant}) == 1
        assert sample("framefleet_jobs_total", {"status": "cancelled", "reason": "",
                                                "tenant": tenant}) == 1
        for _, status, _ in ends:
            held = sample("framefleet_gpu_held_seconds_total", {"status": status, "tenant": tenant})
            assert held is not None and held >= 0
        records = {h.job_id: h for h in read_held(app) if h.tenant == tenant}
        assert [(records[j].status, records[j].reason) for j in runs] == [
            (status, reason) for _, status, reason in ends]
        ttl = app.backend.client.ttl(next(iter(app.backend.client.scan_iter(
            match=f"{HELD_PREFIX}{tenant}:{runs[0]}:*"))))
        assert 0 < ttl <= Settings().result_expires_s
    finally:
        app.close()
