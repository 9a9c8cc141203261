"""A submitted job as the client sees it: its state, progress, result, and a wait with a bar.

``JobHandle`` is cheap to create; every call asks the result backend (one read of state and
payload together) and, when the backend knows nothing, the job registry.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from typing import Any

from celery import Celery
from celery.result import AsyncResult

from producer.client.connection import broker_errors
from producer.client.jobstate import JobState, from_meta
from producer.control import Flags, flags_for
from producer.errors import JobCancelled, JobFailed, UnknownJobError
from producer.spec import JobResult, Progress, split_key

#: How long ``JobHandle.wait`` lets an id stay unknown before it says so.
UNKNOWN_GRACE_S = 5.0


def _io(app: Celery) -> AbstractContextManager[None]:
    """Connection failures inside become one-line ``BrokerError``s naming the URL."""
    conf = app.conf
    return broker_errors(str(conf.broker_url), str(conf.result_backend or conf.broker_url))


def _unknown(job_id: str) -> UnknownJobError:
    return UnknownJobError(f"job {job_id}: no such job (never submitted, or its record expired)")


class JobHandle:
    """One submitted job. Cheap to create; every call asks the result backend.

    ``key`` is the job's identity (``producer.spec.job_key``: ``tenant:job_id``, a bare
    ``job_id`` for the default tenant); ``tenant`` and ``job_id`` are its parts."""

    def __init__(self, app: Celery, key: str, flags: Flags | None = None) -> None:
        self.app = app
        self.key = key
        self.tenant, self.job_id = split_key(key)
        self._flags = flags
        self._known = False  # the registry has the id (it never forgets one while it lives)

    def _async(self) -> AsyncResult:
        return AsyncResult(self.key, app=self.app)

    def status(self) -> str:
        """Celery's state: PENDING (unknown or queued alike: ``state()`` tells them apart),
        STARTED, PROGRESS, RETRY, SUCCESS, FAILURE or REVOKED."""
        with _io(self.app):
            return str(self._async().state)

    def _meta(self) -> tuple[str, Any]:
        # One read of state and payload together: two reads could straddle a state change.
        with _io(self.app):
            meta = self.app.backend.get_task_meta(self.key)
        return str(meta.get("status", "PENDING")), meta.get("result")

    def registered(self) -> bool:
        """Whether this job_id was ever submitted (its claim is in the job registry)."""
        if not self._known:
            with _io(self.app):
                flags = self._flags or flags_for(self.app)
                self._known = flags.registered(self.key) is not None
        return self._known

    def state(self) -> JobState:
        """The job's state, UNKNOWN and QUEUED told apart, with progress, worker or reason."""
        status, info = self._meta()
        return from_meta(self.key, status, info, status == "PENDING" and self.registered())

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
            raise JobCancelled(f"job {self.key} was cancelled")
        if state == "FAILURE":
            exc = ar.result
            raise JobFailed(self.key, type(exc).__name__, str(exc))
        raise TimeoutError(f"job {self.key} is not finished (state {state})")

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
        bar = _Bar(self.key) if progress else None
        try:
            while True:
                js = self.state()
                if js.state == "UNKNOWN" and time.monotonic() - start >= unknown_grace_s:
                    raise _unknown(self.key)
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
                    raise TimeoutError(f"job {self.key} still {js.state} after {timeout:g} s")
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
