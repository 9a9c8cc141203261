"""Submit paths the queue benchmark (``queue_bench.py``) times against ``Client.submit``.

Each variant patches one fresh Client in the benchmark process only: production files are
unchanged, and every variant but ``raw_send_task`` and ``submit_many`` still runs the real
``Client.submit``. Each stands for one proposed change (see ``bench/results/queue-cpu.md``).
``client_submit_many`` is no variant: the shipped bulk path, ``Client.submit_many``, timed
beside the single submit (``--bulk-jobs``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from producer.app import TASK_NAME, redis_priority
from producer.client import Client
from producer.state import keys
from producer.wire.spec import JobSpec

Send = Callable[[JobSpec], Any]


def send_raw(client: Client) -> Send:
    """``app.send_task`` with the message Client.submit sends, without its registry calls."""

    def send(spec: JobSpec) -> Any:
        return client.app.send_task(
            TASK_NAME, args=[spec.model_dump(mode="json")], task_id=spec.key,
            priority=redis_priority(spec.priority), soft_time_limit=spec.time_limit_s,
            time_limit=spec.time_limit_s + 60)

    return send


def short_argsrepr(c: Client) -> None:
    """argsrepr/kwargsrepr given, so Celery does not saferepr() the whole spec per message."""
    orig = c.app.send_task

    def send_task(name: str, *a: Any, task_id: str | None = None, **kw: Any) -> Any:
        return orig(name, *a, task_id=task_id, argsrepr=f"[<JobSpec {task_id}>]",
                    kwargsrepr="{}", **kw)

    c.app.send_task = send_task


def no_subscribe(c: Client) -> None:
    """No SUBSCRIBE/UNSUBSCRIBE celery-task-meta-<id>: JobHandle polls, it never listens."""
    c.app.backend.on_task_call = lambda producer, task_id: None


def kombu_batch(c: Client) -> None:
    """The task LPUSH and the task-sent PUBLISH in one pipeline (kombu ≥ 5.7 Producer.batch)."""
    orig = c.app.send_task

    def send_task(*a: Any, **kw: Any) -> Any:
        with c.app.producer_or_acquire() as producer, producer.batch():
            return orig(*a, producer=producer, **kw)

    c.app.send_task = send_task


def submit_many(c: Client, jobs: list[JobSpec], size: int = 100) -> None:
    """A sketch of a bulk ``Client.submit_many``: per ``size`` jobs, one pipelined round trip
    claims every job_id (the Lua claim) and one pipelined round trip publishes every new job
    with its task-sent event. A job_id already claimed takes the ``submit()`` path after."""
    r = c.app.backend.client
    claim = r.register_script(keys.CLAIM)  # the registry's own claim (clears a stale cancel)
    again = []
    for i in range(0, len(jobs), size):
        chunk = jobs[i:i + size]
        with r.pipeline(transaction=False) as pipe:
            for spec in chunk:
                claim(keys=[keys.claim(spec.key), keys.cancel(spec.key),
                            keys.spec_doc(spec.key)],
                      args=[spec.digest(), keys.SPEC_TTL_S, "1", ""], client=pipe)
            claimed = pipe.execute()
        with c.app.producer_or_acquire() as producer, producer.batch():
            for spec, old in zip(chunk, claimed, strict=True):
                if old is not None:
                    again.append(spec)
                    continue
                c.app.send_task(
                    TASK_NAME, args=[spec.model_dump(mode="json")], task_id=spec.key,
                    priority=redis_priority(spec.priority), soft_time_limit=spec.time_limit_s,
                    time_limit=spec.time_limit_s + 60, producer=producer,
                    argsrepr=f"[<JobSpec {spec.job_id}>]", kwargsrepr="{}")
    for spec in again:
        c.submit(spec)


def client_submit_many(c: Client, jobs: list[JobSpec]) -> None:
    """The shipped bulk path, ``Client.submit_many``: every job's checks, claim and sent mark,
    a chunk's claims in one pipeline, its publishes in one kombu batch."""
    refused = [o for o in c.submit_many(jobs) if not o.ok]
    if refused:
        raise RuntimeError(f"{len(refused)} jobs refused, the first: {refused[0].error}")


Patch = Callable[[Client], None]
#: (key, what, app.conf changes, patches); every path but raw_send_task and the two bulk
#: paths runs Client.submit.
PATHS: list[tuple[str, str, dict[str, Any], list[Patch]]] = [
    ("client_submit", "Client.submit", {}, []),
    ("raw_send_task", "app.send_task alone (no registry)", {}, []),
    ("client_submit_many", "Client.submit_many (bulk: chunks of 500)", {}, []),
    ("no_sent_event", "submit, task_send_sent_event=False", {"task_send_sent_event": False}, []),
    ("kombu_batch", "submit, LPUSH + PUBLISH pipelined", {}, [kombu_batch]),
    ("batch_no_sent_event", "submit, pipelined + task_send_sent_event=False",
     {"task_send_sent_event": False}, [kombu_batch]),
    ("submit_many", "bulk sketch: 100 jobs per 2 pipelined round trips (sent event kept)", {},
     [no_subscribe]),
]
