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


def send_job(app: Celery, spec: JobSpec, payload: dict[str, Any], settings: Settings,
             batch: Any = None, declare: bool = True) -> None:
    """Send ``spec`` (``payload``: its JSON form) as the task of id ``spec.key``, with its
    priority and time limits (``producer.wire.rules.time_limits``: the worker sets them again
    from the spec and its own settings).

    ``batch``: a bulk submit's kombu producer, inside its ``batch()``: the publish is only
    buffered (the batch's pipeline sends it, and fails as a whole), so it is not retried
    alone; ``declare=False``: the queue was declared by the batch's first message."""
    hard, soft = time_limits(payload, settings)
    options: dict[str, Any] = {}
    if batch is not None:
        options = {"producer": batch, "retry": False, **({} if declare else {"declare": []})}
    app.send_task(
        TASK_NAME,
        **options,
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
