"""The task's concerns through Celery's own retry machinery, against a real Redis backend.

Tasks run eagerly (``Task.apply``): Celery executes a retry at once in the same process
(countdowns are not waited for), so a test sees every attempt, the final state, and what the
concerns recorded on the way: the backend's PROGRESS/REVOKED states, the cancel flags, the
``framefleet_jobs_total`` counters. ``Scripted`` is a task that runs a test's ``work`` inside
the concerns, as ``worker.tasks.decode_video`` runs ``run_job``.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from celery import Celery, Task

from producer.settings import Settings
from producer.wire.spec import DecoderSpec, InputSpec, JobResult, JobSpec, OutputSpec
from worker.concerns import CONCERNS, Concern, run_concerns
from worker.metrics import JOBS, RETRIES
from worker.run import DecoderCache, Run, run_job

#: What a scripted task runs: the run (hooks attached by the concerns) and the attempt (1, …).
Work = Callable[[Run, int], JobResult]


def job_spec(tmp: Path, tenant: str) -> JobSpec:
    """A pattern job of 13 frames reading latents from ``tmp``."""
    np.save(tmp / "z.npy", np.zeros((16, 4, 4, 6), np.float32))
    return JobSpec(job_id=f"c-{secrets.token_hex(6)}", tenant=tenant,
                   input=InputSpec(uri=(tmp / "z.npy").as_uri()),
                   decoder=DecoderSpec(name="pattern"),
                   output=OutputSpec(uri=(tmp / "out").as_uri()))


def jobs_counted(status: str, tenant: str) -> float:
    """Ends (success, failure, cancelled) of any reason; "retry": retries and requeues."""
    counter, name = (RETRIES, "framefleet_job_retries_total") if status == "retry" else (
        JOBS, "framefleet_jobs_total")
    key = "kind" if status == "retry" else "status"
    return sum(sample.value for sample in next(iter(counter.collect())).samples
               if sample.name == name and sample.labels["tenant"] == tenant
               and (status == "retry" or sample.labels[key] == status))


def counts(tenant: str) -> dict[str, float]:
    return {s: jobs_counted(s, tenant) for s in ("success", "failure", "retry", "cancelled")}


class Scripted:
    """A task on ``app`` that runs ``work`` inside ``concerns``; ``attempts`` counts runs."""

    def __init__(self, app: Celery, spec: JobSpec, settings: Settings, work: Work,
                 concerns: tuple[Callable[[Run, Task], Concern], ...] = CONCERNS) -> None:
        self.attempts = 0
        self.runs: list[Run] = []

        def body(task: Task, tiled: bool = False, error_retries: int = 0,
                 requeues: int = 0) -> dict[str, Any]:
            self.attempts += 1
            run = Run(spec=spec, settings=settings, node=str(task.request.hostname),
                      tiled=tiled, error_retries=error_retries, requeues=requeues)
            self.runs.append(run)
            attempt = self.attempts
            return run_concerns(run, task, concerns, lambda: work(run, attempt))

        self.task: Task = app.task(bind=True, name=f"test.scripted.{secrets.token_hex(4)}",
                                   shared=False, lazy=False)(body)

    def apply(self, job_id: str) -> Any:
        return self.task.apply(task_id=job_id)


def real_run(cache: DecoderCache) -> Callable[[Run], JobResult]:
    """The real runner over ``cache``."""
    def work(run: Run) -> JobResult:
        return run_job(run.spec, cache, run)
    return work


def real_work(cache: DecoderCache) -> Work:
    real = real_run(cache)
    return lambda run, attempt: real(run)
