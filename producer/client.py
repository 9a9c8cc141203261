"""The light client: submit JobSpecs, follow their progress, fetch results, cancel.

Imports no torch, av, boto3 or worker code; it only speaks the wire format of ``producer.spec``.
"""

from __future__ import annotations

import json
import time
from contextlib import AbstractContextManager
from typing import Any

from celery import Celery
from celery.result import AsyncResult

from producer.app import TASK_NAME, make_app, redis_priority
from producer.connection import bound_client_app, broker_errors
from producer.control import Flags, flags_for
from producer.errors import (
    InvalidJobError,
    JobCancelled,
    JobConflictError,
    JobFailed,
    UnknownJobError,
)
from producer.jobstate import FINISHED, JobState, from_meta
from producer.settings import Settings, get_settings
from producer.spec import JobResult, JobSpec, Progress
from producer.webhooks import UrlPolicy, check_notify
from producer.weights import check_job_weights

# Resubmitting a job that ended without an output runs it again: FAILURE, and REVOKED too.
# A cancel stops a run; it does not retire the job_id, which names the job's output folder,
# so the same spec submitted again after a cancel is a deliberate request to run it. This is
# why cancel sets a flag and never calls Celery's revoke: workers remember revoked ids and
# would drop every later run of that id.
RERUNNABLE = {"FAILURE", "REVOKED"}
#: How long ``JobHandle.wait`` lets an id stay unknown before it says so.
UNKNOWN_GRACE_S = 5.0


def _io(app: Celery) -> AbstractContextManager[None]:
    """Connection failures inside become one-line ``BrokerError``s naming the URL."""
    conf = app.conf
    return broker_errors(str(conf.broker_url), str(conf.result_backend or conf.broker_url))


def _unknown(job_id: str) -> UnknownJobError:
    return UnknownJobError(f"job {job_id}: no such job (never submitted, or its record expired)")


class JobHandle:
    """One submitted job. Cheap to create; every call asks the result backend."""

    def __init__(self, app: Celery, job_id: str, flags: Flags | None = None) -> None:
        self.app = app
        self.job_id = job_id
        self._flags = flags
        self._known = False  # the registry has the id (it never forgets one while it lives)

    def _async(self) -> AsyncResult:
        return AsyncResult(self.job_id, app=self.app)

    def status(self) -> str:
        """Celery's state: PENDING (unknown or queued alike: ``state()`` tells them apart),
        STARTED, PROGRESS, RETRY, SUCCESS, FAILURE or REVOKED."""
        with _io(self.app):
            return str(self._async().state)

    def _meta(self) -> tuple[str, Any]:
        # One read of state and payload together: two reads could straddle a state change.
        with _io(self.app):
            meta = self.app.backend.get_task_meta(self.job_id)
        return str(meta.get("status", "PENDING")), meta.get("result")

    def registered(self) -> bool:
        """Whether this job_id was ever submitted (its claim is in the job registry)."""
        if not self._known:
            with _io(self.app):
                flags = self._flags or flags_for(self.app)
                self._known = flags.registered(self.job_id) is not None
        return self._known

    def state(self) -> JobState:
        """The job's state, UNKNOWN and QUEUED told apart, with progress, worker or reason."""
        status, info = self._meta()
        return from_meta(self.job_id, status, info, status == "PENDING" and self.registered())

    def progress(self) -> Progress | None:
        state, info = self._meta()
        if state == "PROGRESS" and isinstance(info, dict):
            return Progress.model_validate(info)
        return None

    def result(self) -> JobResult:
        """The result of a finished job; raises JobFailed/JobCancelled otherwise."""
        with _io(self.app):
            return self._result()

    def _result(self) -> JobResult:
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
        self, timeout: float | None = None, progress: bool = False, poll_s: float = 0.05,
        unknown_grace_s: float = UNKNOWN_GRACE_S,
    ) -> JobResult:
        """Block until the job finishes; with ``progress`` draw a rich progress bar that shows
        the state (queued, started, retrying and why, frames done).

        Raises ``UnknownJobError`` when the id is still unknown (never submitted) after
        ``unknown_grace_s``: a job sent around the client, straight to the queue, is known only
        once a worker starts it. JobFailed / JobCancelled as ``result()``; TimeoutError after
        ``timeout`` s (None: no limit).
        """
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        bar = _Bar(self.job_id) if progress else None
        try:
            while True:
                js = self.state()
                if js.state == "UNKNOWN" and time.monotonic() - start >= unknown_grace_s:
                    raise _unknown(self.job_id)
                if js.finished:
                    result = self.result()
                    if bar is not None:
                        done = result.manifest
                        bar.update(Progress(
                            frames_done=done.frames, frames_total=done.frames,
                            segments_done=len(done.segments)))
                    return result
                if bar is not None:
                    bar.show(js)
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"job {self.job_id} still {js.state} after {timeout:g} s")
                time.sleep(poll_s)
        finally:
            if bar is not None:
                bar.close()


class _Bar:
    """A rich progress bar fed from PROGRESS states (imported lazily: rich is for the CLI)."""

    def __init__(self, job_id: str) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        # The state column is plain text: a retry's reason may hold brackets.
        self.progress = Progress(
            "[bold]{task.description}", BarColumn(), TextColumn("{task.fields[what]}",
                                                               markup=False),
            TimeElapsedColumn(),
        )
        self.task = self.progress.add_task(job_id, total=None, what="submitted", unit="")
        self.progress.start()

    def show(self, js: JobState) -> None:
        """Queued, started, retrying (and why) before the frames, then the frames."""
        if js.progress is not None:
            self.update(js.progress)
        else:
            self.progress.update(self.task, what=js.describe())

    def update(self, p: Progress) -> None:
        if p.stage == "denoise":  # generate jobs: denoise 12/50, then frames
            self.progress.update(self.task, completed=p.steps_done, total=p.steps_total,
                                 what=p.text, unit="denoise steps")
            return
        self.progress.update(
            self.task, completed=p.frames_done, total=p.frames_total,
            what=f"{p.frames_done}/{p.frames_total} frames, {p.segments_done} segments",
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
        if app is None:
            # Before the backend exists: Celery reads its timeouts when it creates it.
            bound_client_app(self.app)
        if app is None and hasattr(self.app.backend, "result_consumer"):
            # JobHandle polls the backend; Celery's per-task pub/sub SUBSCRIBE on send would
            # cost two extra Redis round trips per submit for nothing.
            self.app.backend.on_task_call = lambda producer, task_id: None

    def submit(self, spec: JobSpec) -> JobHandle:
        """Enqueue ``spec``. The same job_id with the same spec returns the existing job's
        handle instead of running it twice, unless it ended in FAILURE or was cancelled
        (REVOKED), or its result has expired: then it is sent again (a complete stored output
        comes back as ``reused``). Resubmitting a job whose cancel no worker has acted on yet
        withdraws the cancel. The same job_id with a different spec raises JobConflictError.
        A spec without ``decoder.weights`` for a decoder that needs them is refused
        (InvalidJobError) before anything is queued."""
        with _io(self.app):
            return self._submit(spec)

    def _submit(self, spec: JobSpec) -> JobHandle:
        settings = self.settings
        check_job_weights(spec)
        if spec.time_limit_s > settings.max_time_limit_s:
            raise InvalidJobError(
                f"time_limit_s: {spec.time_limit_s} exceeds the fleet's max_time_limit_s "
                f"{settings.max_time_limit_s}"
            )
        settings.check_output_uri(spec.output.uri)  # workers check again on receipt
        if spec.notify is not None:  # the fleet's allow-list; workers check again after DNS
            check_notify(spec.notify.urls, UrlPolicy.from_settings(settings))
        payload = spec.model_dump(mode="json")
        size = len(json.dumps(payload))
        if size > settings.max_message_bytes:
            raise InvalidJobError(f"job spec is {size} bytes, over {settings.max_message_bytes}")
        digest = spec.digest()
        flags = flags_for(self.app, self.settings)
        existing = flags.claim(spec.job_id, digest, clear_cancel=True)
        handle = JobHandle(self.app, spec.job_id, flags)
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
                if state not in FINISHED and flags.cancelled(spec.job_id):
                    # Cancelled, not stopped yet: submitting again means "run it after all".
                    flags.clear_cancel(spec.job_id)
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
        return JobHandle(self.app, job_id, flags_for(self.app, self.settings))

    def state(self, job_id: str) -> JobState:
        """``get(job_id).state()``: UNKNOWN, QUEUED, STARTED, PROGRESS, RETRY, SUCCESS, …"""
        return self.get(job_id).state()

    def cancel(self, job_id: str) -> str:
        """Cooperative cancel: the worker stops between chunks, writes no manifest, and the
        job ends REVOKED; a job still queued ends so when a worker receives it.

        Returns the job's state when asked. A finished job is left as it is. Raises
        ``UnknownJobError`` for an id that was never submitted: nothing is flagged.
        """
        with _io(self.app):
            flags = flags_for(self.app, self.settings)
            handle = JobHandle(self.app, job_id, flags)
            state = handle.status()
            if state == "PENDING" and not handle.registered():
                raise _unknown(job_id)
            if state not in FINISHED:
                flags.set_cancel(job_id)
            return state

    def ping(self, timeout: float = 1.0) -> list[dict[str, Any]]:
        """Workers that answer a broadcast ping."""
        with _io(self.app):
            return list(self.app.control.ping(timeout=timeout) or [])
