"""A job as the OpenAI video object (``openai.types.Video``), and as the native job object.

``status``: queued (QUEUED, RETRY, REQUEUED), in_progress (STARTED, PROGRESS), completed
(SUCCESS), failed (FAILURE, and REVOKED: the object has no "cancelled"; its error says so).
``progress`` (0–100) weighs a generate job's denoise steps as the first 80 % and its frames
as the rest (denoising is most of a job's GPU time); a latents job counts frames only. It
never goes back: a cancel, a failure or a retry reads as 0 from the fleet, so the gateway
shows the highest value any replica has shown (``Registry.progress``). framefleet's own facts
go in one extra object, ``framefleet``, which the SDK keeps as an extra field. A failure's
reason reads as ``producer.api.failures`` maps it: a code and a short message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from producer.api import failures
from producer.api.registry import Record
from producer.client.jobstate import JobState
from producer.wire.spec import JobResult

DENOISE_SHARE = 80
STATUS = {"UNKNOWN": "queued", "QUEUED": "queued", "RETRY": "queued", "REQUEUED": "queued",
          "STARTED": "in_progress", "PROGRESS": "in_progress", "SUCCESS": "completed",
          "FAILURE": "failed", "REVOKED": "failed"}


@dataclass(frozen=True)
class View:
    """One observation of a job: the record, the fleet's state, the result when it succeeded,
    when a replica first saw it finished, the progress shown (0-100, never less than
    before), and whether it is made with random weights (None: unknown yet)."""

    record: Record
    state: JobState
    result: JobResult | None
    completed_at: float | None
    percent: int
    random_weights: bool | None = None

    @property
    def status(self) -> str:
        return STATUS.get(self.state.state, "queued")


def progress(rec: Record, js: JobState) -> int:
    """The progress of this one observation (the view keeps the highest one shown)."""
    if js.state == "SUCCESS":
        return 100
    p = js.progress
    if p is None:
        return 0
    if p.stage == "denoise":
        return DENOISE_SHARE * p.steps_done // max(p.steps_total, 1)
    frames = p.frames_done * 100 // max(p.frames_total, 1)
    if not rec.generate:
        return min(frames, 99)
    return min(DENOISE_SHARE + frames * (100 - DENOISE_SHARE) // 100, 99)


def links(rec: Record) -> dict[str, str]:
    base = f"/v1/jobs/{rec.id}"
    return {"playlist_url": f"{base}/files/index.m3u8",
            "manifest_url": f"{base}/files/manifest.json",
            "content_url": f"/v1/videos/{rec.id}/content", "events_url": f"{base}/events"}


def extras(view: View) -> dict[str, Any]:
    """The ``framefleet`` object: links, cost, tier, worker and the fleet's own state."""
    rec, result = view.record, view.result
    cost = result.cost if result is not None else None
    return {
        "job_id": rec.job_id, "state": view.state.state, "detail": failures.describe(view.state),
        **links(rec),
        "cost_usd": cost.total_usd if cost is not None else None,
        "usd_per_video_minute": cost.usd_per_video_minute if cost is not None else None,
        "tier": rec.tier,
        # the Celery node name (cpu0@host, gpu3@host), as the CLI and the ledger name it
        "worker": result.worker.node if result is not None else view.state.worker,
        "random_weights": view.random_weights,
        "frames": result.manifest.frames if result is not None else None,
    }


def error(view: View) -> dict[str, Any] | None:
    js = view.state
    if js.state == "REVOKED":
        return {"code": "cancelled", "message": "the job was cancelled"}
    if js.state == "FAILURE":
        found = failures.failure(js) or failures.UNEXPECTED
        return {"code": found.code, "message": found.message}
    return None


def video_object(view: View) -> dict[str, Any]:
    """The OpenAI video object (``openai.types.Video`` parses it)."""
    rec, result = view.record, view.result
    size, seconds = rec.size or "", rec.seconds or ""
    if result is not None:
        m = result.manifest
        size = f"{m.width}x{m.height}"
        seconds = seconds or f"{m.video_seconds:g}"
    finished = view.state.finished
    return {
        "id": rec.id, "object": "video", "status": view.status, "progress": view.percent,
        "created_at": int(rec.created_at),
        "completed_at": int(view.completed_at) if finished and view.completed_at else None,
        "expires_at": None, "model": rec.model or "", "prompt": rec.prompt, "size": size,
        "seconds": seconds, "remixed_from_video_id": None, "error": error(view),
        "framefleet": extras(view),
    }


def job_object(view: View) -> dict[str, Any]:
    """The native job object: the fleet's state, its progress payload and the result."""
    rec, js = view.record, view.state
    return {
        "id": rec.id, "object": "framefleet.job", "job_id": rec.job_id, "state": js.state,
        "status": view.status, "detail": failures.describe(js), "percent": view.percent,
        "progress": js.progress.model_dump() if js.progress is not None else None,
        "reason": failures.reason(js), "worker": js.worker, "created_at": rec.created_at,
        "completed_at": view.completed_at if js.finished else None, **links(rec),
        "result": view.result.model_dump(mode="json") if view.result is not None else None,
    }
