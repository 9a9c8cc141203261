"""ProgressReport, and the concern interface itself: a new concern plugs in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from celery import Celery

from producer.errors import FatalJobError
from producer.settings import Settings
from producer.wire.spec import JobResult, Progress
from tests.worker.concerns.scripted import Scripted, job_spec, real_run
from worker.concerns import CONCERNS, Concern, Outcome
from worker.run import DecoderCache, Run


def test_progress_is_stored_throttled_and_the_last_always(
    app: Celery, tmp_path: Path, tenant: str
) -> None:
    spec = job_spec(tmp_path, tenant)
    seen: list[Any] = []

    def stored() -> Any:
        meta = app.backend.get_task_meta(spec.key)
        return meta["status"], (meta["result"] or {}).get("frames_done")

    def work(run: Run, attempt: int) -> JobResult:
        run.report(Progress(frames_done=1, frames_total=3, segments_done=0))
        seen.append(stored())
        run.report(Progress(frames_done=2, frames_total=3, segments_done=0))  # too soon
        seen.append(stored())
        run.report(Progress(frames_done=3, frames_total=3, segments_done=1))  # the last
        seen.append(stored())
        raise FatalJobError("stop here")

    Scripted(app, spec, Settings(file_roots=str(tmp_path)), work).apply(spec.key)
    assert seen == [("PROGRESS", 1), ("PROGRESS", 1), ("PROGRESS", 3)]


def test_a_new_concern_plugs_in_and_cannot_break_the_outcome(
    app: Celery, tmp_path: Path, tenant: str
) -> None:
    # Given a concern added after the default ones, whose outcome hook fails
    spec = job_spec(tmp_path, tenant)
    events: list[str] = []

    class Recorder(Concern):
        def before_run(self) -> None:
            events.append(f"before {self.run.spec.key}")
            self.run.progress_hooks.append(lambda p: events.append(f"progress {p.frames_done}"))

        def on_error(self, error: BaseException) -> Outcome | None:
            events.append(f"error {type(error).__name__}")  # only errors nobody decided
            return None

        def on_outcome(self, outcome: Outcome) -> None:
            events.append(f"outcome {outcome.status}")
            raise RuntimeError("webhook down")

    real = real_run(DecoderCache(torch.device("cpu")))
    scripted = Scripted(app, spec, Settings(file_roots=str(tmp_path)),
                        lambda run, attempt: real(run), concerns=(*CONCERNS, Recorder))
    # When the job runs
    result = scripted.apply(spec.key)
    # Then the concern saw the run, its progress and its end, and the job still succeeded
    assert result.state == "SUCCESS"
    assert events[0] == f"before {spec.key}"
    assert "progress 13" in events
    assert events[-1] == "outcome success"
    assert not any(e.startswith("error") for e in events)
