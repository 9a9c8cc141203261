"""What a job is doing, as the client tells it: one read of the result backend, plus the job
registry when the backend knows nothing.

Celery says PENDING both for a job that waits in the queue and for an id nobody ever
submitted. The registry (``producer.state.control``: every submit claims its job_id first) tells
them apart: ``QUEUED`` or ``UNKNOWN``. RETRY and FAILURE carry the reason, STARTED the worker.
The registry outlives results (30 days against ``FRAMEFLEET_RESULT_EXPIRES_S``), so a job
finished longer ago than that reads QUEUED too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from producer.wire.spec import Progress

#: Every state ``JobState.state`` takes, in a job's order (RETRY goes back to QUEUED).
STATES: tuple[str, ...] = (
    "UNKNOWN", "QUEUED", "STARTED", "PROGRESS", "RETRY", "REQUEUED", "SUCCESS", "FAILURE",
    "REVOKED",
)
FINISHED = frozenset({"SUCCESS", "FAILURE", "REVOKED"})
#: What each state means, for help texts and the README.
MEANING = {
    "UNKNOWN": "never submitted (or its record expired)",
    "QUEUED": "submitted, waiting for a worker (or its result expired)",
    "STARTED": "a worker took it",
    "PROGRESS": "running: the stage (denoise n/N, decode frames, upload) and the worker",
    "RETRY": "a transient error; runs again after a back-off (the reason is shown)",
    "REQUEUED": "its worker's host was lost; back in the queue for another (reason shown)",
    "SUCCESS": "finished: the manifest is written",
    "FAILURE": "failed (the reason is shown); resubmitting runs it again",
    "REVOKED": "cancelled; resubmitting runs it again",
}


@dataclass(frozen=True)
class JobState:
    """One observation of a job: its state and what goes with it."""

    job_id: str
    state: str
    progress: Progress | None = None
    worker: str | None = None
    reason: str | None = None

    @property
    def finished(self) -> bool:
        return self.state in FINISHED

    def detail(self) -> str:
        """What goes with the state, for ``framefleet status`` ('' when nothing does):
        ``denoise 37/40 on gpu0@host``, ``decode 13/49 frames, 1 segment on …``."""
        if self.state == "UNKNOWN":
            return MEANING["UNKNOWN"]
        where = f" on {self.worker}" if self.worker else ""
        if self.state == "PROGRESS" and self.progress is not None:
            return self.progress.describe() + where
        if self.state == "STARTED" and self.worker:
            return f"on {self.worker}"
        return self.reason or ""

    def describe(self) -> str:
        """A short human text: ``queued``, ``retrying: StorageError: …``, ``decode 13/33
        frames, 1 segment``."""
        if self.state == "PROGRESS" and self.progress is not None:
            return self.progress.describe()
        if self.state == "STARTED":
            return f"started on {self.worker}" if self.worker else "started"
        if self.state == "RETRY":
            return f"retrying: {self.reason}" if self.reason else "retrying"
        if self.state == "REQUEUED":
            return f"requeued: {self.reason}" if self.reason else "requeued"
        text = {"UNKNOWN": "unknown job", "QUEUED": "queued", "SUCCESS": "done",
                "FAILURE": "failed", "REVOKED": "cancelled"}.get(self.state, self.state.lower())
        return f"{text}: {self.reason}" if self.reason and self.state == "FAILURE" else text


def _reason(result: Any) -> str | None:
    if isinstance(result, BaseException):
        return f"{type(result).__name__}: {result}"
    if isinstance(result, dict) and "exc_type" in result:
        return f"{result['exc_type']}: {result.get('exc_message')}"
    if isinstance(result, dict) and "reason" in result:  # REQUEUED by the host-loss sweeper
        return str(result["reason"])
    return None


def from_meta(job_id: str, status: str, result: Any, registered: bool) -> JobState:
    """Interpret Celery's ``status``/``result`` pair (``registered``: the id was claimed)."""
    if status == "PENDING":
        return JobState(job_id, "QUEUED" if registered else "UNKNOWN")
    if status == "PROGRESS" and isinstance(result, dict):
        try:
            progress = Progress.model_validate(result)
        except ValidationError:  # a newer worker's report: the state still reads
            return JobState(job_id, status, worker=result.get("worker"))
        return JobState(job_id, status, progress=progress, worker=progress.worker)
    if status == "STARTED":
        worker = result.get("hostname") if isinstance(result, dict) else None
        return JobState(job_id, status, worker=worker)
    if status in ("RETRY", "REQUEUED", "FAILURE", "REVOKED"):
        return JobState(job_id, status, reason=_reason(result))
    return JobState(job_id, status)
