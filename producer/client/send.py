"""The one way a job's message is put on the queue: the client's submit and the worker's
lost-message reconciler (``worker.lifecycle.reconcile``) send the same message."""

from __future__ import annotations

import time
from typing import Any

from celery import Celery

from producer.app import ENQUEUED_AT_HEADER, TASK_NAME, redis_priority
from producer.settings import Settings
from producer.wire.rules import time_limits
from producer.wire.spec import JobSpec


def send_job(app: Celery, spec: JobSpec, payload: dict[str, Any], settings: Settings) -> None:
    """Send ``spec`` (``payload``: its JSON form) as the task of id ``spec.key``, with its
    priority and time limits (``producer.wire.rules.time_limits``: the worker sets them again
    from the spec and its own settings)."""
    hard, soft = time_limits(payload, settings)
    app.send_task(
        TASK_NAME,
        args=[payload],
        task_id=spec.key,
        priority=redis_priority(spec.priority),
        soft_time_limit=soft,
        time_limit=hard,
        # Events and logs name the job, not its whole spec (and not its URIs).
        argsrepr=f"[<JobSpec {spec.key}>]",
        kwargsrepr="{}",
        headers={ENQUEUED_AT_HEADER: time.time()},  # queue wait and oldest age
    )
