"""The light client: submit JobSpecs, follow their progress, fetch results, cancel.

Imports no torch, av, boto3 or worker code; it only speaks the wire format of ``producer.spec``.
"""

from __future__ import annotations

import json
import time
from typing import Any

from celery import Celery
from celery.result import AsyncResult

from producer.app import TASK_NAME, make_app, redis_priority
from producer.control import flags_for
from producer.errors import InvalidJobError, JobCancelled, JobConflictError, JobFailed
from producer.settings import Settings, get_settings
from producer.spec import JobResult, JobSpec, Progress
from producer.webhooks import UrlPolicy, check_notify

FINISHED = {"SUCCESS", "FAILURE", "REVOKED"}
# Not REVOKED: workers remember revoked ids, so a cancelled job_id stays cancelled.
RERUNNABLE = {"FAILURE"}


class JobHandle:
    """One submitted job. Cheap to create; every call asks the result backend."""

    def __init__(self, app: Celery, job_id: str) -> None:
        self.app = app
        self.job_id = job_id

    def _async(self) -> AsyncResult:
        return AsyncResult(self.job_id, app=self.app)

    def status(self) -> str:
        """PENDING (unknown or queued), STARTED, PROGRESS, RETRY, SUCCESS, FAILURE or REVOKED."""
        return str(self._async().state)

    def _meta(self) -> tuple[str, Any]:
        # One read of state and payload together: two reads could straddle a state change.
        meta = self.app.backend.get_task_meta(self.job_id)
        return str(meta.get("status", "PENDING")), meta.get("result")

    def progress(self) -> Progress | None:
        state, info = self._meta()
        if state == "PROGRESS" and isinstance(info, dict):
            return Progress.model_validate(info)
        return None

    def result(self) -> JobResult:
        """The result of a finished job; raises JobFailed/JobCancelled otherwise."""
        ar = self._async()
        state = ar.state
        if state == "SUCCESS":
            return JobResult.model_validate(ar.result)
        if state == "REVOKED":
            raise JobCancelled(f"job {self.job_id} was cancelled")
        if state == "FAILURE":
            exc = ar.result
            raise JobFailed(self.job_id, type(exc).__name__, str(exc))
        raise TimeoutError(f"job {self.job_id} is not finished (state {state})")

    def wait(
        self, timeout: float | None = None, progress: bool = False, poll_s: float = 0.05
    ) -> JobResult:
        """Block until the job finishes; with ``progress`` draw a rich progress bar."""
        deadline = None if timeout is None else time.monotonic() + timeout
        bar = _Bar(self.job_id) if progress else None
        try:
            while True:
                state, info = self._meta()
                if state in FINISHED:
                    result = self.result()
                    if bar is not None:
                        done = result.manifest
                        bar.update(Progress(
                            frames_done=done.frames, frames_total=done.frames,
                            segments_done=len(done.segments)))
                    return result
                if bar is not None and state == "PROGRESS" and isinstance(info, dict):
                    bar.update(Progress.model_validate(info))
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"job {self.job_id} still {state} after {timeout} s")
                time.sleep(poll_s)
        finally:
            if bar is not None:
                bar.close()


class _Bar:
    """A rich progress bar fed from PROGRESS states (imported lazily: rich is for the CLI)."""

    def __init__(self, job_id: str) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        self.progress = Progress(
            "[bold]{task.description}", BarColumn(), MofNCompleteColumn(), "{task.fields[unit]}",
            "{task.fields[segments]} segments", TimeElapsedColumn(),
        )
        self.task = self.progress.add_task(job_id, total=None, segments=0, unit="frames")
        self.progress.start()

    def update(self, p: Progress) -> None:
        if p.stage == "denoise":  # generate jobs: denoise 12/50, then frames
            self.progress.update(self.task, completed=p.steps_done, total=p.steps_total,
                                 segments=0, unit="denoise steps")
            return
        self.progress.update(
            self.task, completed=p.frames_done, total=p.frames_total, segments=p.segments_done,
            unit="frames",
        )

    def close(self) -> None:
        self.progress.stop()


class Client:
    """Submit and follow jobs.

    ``settings`` (default: the environment's) give the fleet's limits and, unless ``app`` or
    the URLs are given, the broker and result backend of the app built with ``make_app``.
    """

    def __init__(
        self, broker_url: str | None = None, backend_url: str | None = None,
        app: Celery | None = None, settings: Settings | None = None,
    ) -> None:
        self.settings = settings or get_settings()
        self.app = app or make_app(broker_url, backend_url, self.settings)
        if app is None and hasattr(self.app.backend, "result_consumer"):
            # JobHandle polls the backend; Celery's per-task pub/sub SUBSCRIBE on send would
            # cost two extra Redis round trips per submit for nothing.
            self.app.backend.on_task_call = lambda producer, task_id: None

    def submit(self, spec: JobSpec) -> JobHandle:
        """Enqueue ``spec``. The same job_id with the same spec returns the existing job's
        handle instead of running it twice (unless it ended in FAILURE, or its result has
        expired: then it is sent again, and a complete stored output comes back as
        ``reused``); the same job_id with a different spec raises JobConflictError."""
        settings = self.settings
        if spec.time_limit_s > settings.max_time_limit_s:
            raise InvalidJobError(
                f"time_limit_s: {spec.time_limit_s} exceeds the fleet's max_time_limit_s "
                f"{settings.max_time_limit_s}"
            )
        if spec.notify is not None:  # the fleet's allow-list; workers check again after DNS
            check_notify(spec.notify.urls, UrlPolicy.from_settings(settings))
        payload = spec.model_dump(mode="json")
        size = len(json.dumps(payload))
        if size > settings.max_message_bytes:
            raise InvalidJobError(f"job spec is {size} bytes, over {settings.max_message_bytes}")
        digest = spec.digest()
        flags = flags_for(self.app, self.settings)
        existing = flags.claim(spec.job_id, digest, clear_cancel=True)
        handle = JobHandle(self.app, spec.job_id)
        if existing is not None:
            if existing != digest:
                raise JobConflictError(
                    f"job_id {spec.job_id!r} was already submitted with a different spec"
                )
            state = handle.status()
            if state in RERUNNABLE:
                flags.reset_runs(spec.job_id)
                AsyncResult(spec.job_id, app=self.app).forget()
            elif not (state == "PENDING" and flags.take_started(spec.job_id)):
                return handle  # queued, running or finished: the existing job
            # else a worker received it and its result has expired since: send it again (the
            # worker returns the output still stored as ``reused``, or runs it if it is gone).
            flags.clear_cancel(spec.job_id)
        try:
            self.app.send_task(
                TASK_NAME,
                args=[payload],
                task_id=spec.job_id,
                priority=redis_priority(spec.priority),
                soft_time_limit=spec.time_limit_s,
                time_limit=spec.time_limit_s + 60,
                # Events and logs name the job, not its whole spec (and not its URIs).
                argsrepr=f"[<JobSpec {spec.job_id}>]",
                kwargsrepr="{}",
                headers={"framefleet_enqueued_at": time.time()},  # queue wait and oldest age
            )
        except BaseException:
            # Nothing was queued: free the job_id, or a resubmission would wait forever.
            if existing is None:
                flags.release(spec.job_id)
            else:  # the next resubmit must send it again
                flags.mark_started(spec.job_id)
            raise
        return handle

    def get(self, job_id: str) -> JobHandle:
        return JobHandle(self.app, job_id)

    def cancel(self, job_id: str) -> None:
        """Cooperative cancel: the worker stops between chunks and writes no manifest.
        A job still queued is dropped when a worker receives it."""
        flags_for(self.app, self.settings).set_cancel(job_id)
        self.app.control.revoke(job_id)

    def ping(self, timeout: float = 1.0) -> list[dict[str, Any]]:
        """Workers that answer a broadcast ping."""
        return list(self.app.control.ping(timeout=timeout) or [])
