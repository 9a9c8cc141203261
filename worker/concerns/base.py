"""The concern interface: ``TaskRun``, ``Concern``, ``Outcome`` and the loop that runs them.

See the package docstring for how a concern plugs in.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, NoReturn

from celery import Task

from producer.control import Flags
from producer.settings import Settings
from producer.spec import JobResult, JobSpec, Progress, SegmentInfo
from worker.run.runner import CostFn, JobContext
from worker.sinks.hls import LivePlaylist

log = logging.getLogger(__name__)

Status = Literal["success", "failure", "retry", "cancelled"]


@dataclass
class TaskRun:
    """One execution of the task for one job: what every concern of that run sees."""

    task: Task
    spec: JobSpec
    settings: Settings
    flags: Flags
    tiled: bool = False
    cost: CostFn | None = None
    #: Retries of retryable errors this job has spent, and its requeues (``retries``).
    error_retries: int = 0
    requeues: int = 0
    #: Called with each progress report of the runner (append in ``before_run``).
    progress_hooks: list[Callable[[Progress], None]] = field(default_factory=list)
    #: Polled between chunks; one True stops the run with JobCancelled.
    cancel_checks: list[Callable[[], bool]] = field(default_factory=list)
    #: Called with each segment once the live playlist lists it, in index order.
    segment_hooks: list[Callable[[SegmentInfo, Progress], None]] = field(default_factory=list)
    #: The job's live playlist, once this run's runner created it.
    playlist: LivePlaylist | None = None

    @property
    def node(self) -> str:
        """The worker's node name (``gpu0@host``)."""
        return str(self.task.request.hostname)

    def job_context(self) -> JobContext:
        """What the runner gets: the hooks of this run's concerns and the task's options."""

        def progress(p: Progress) -> None:
            for hook in self.progress_hooks:
                hook(p)

        def cancelled() -> bool:
            return any(check() for check in self.cancel_checks)

        def segment_landed(seg: SegmentInfo, p: Progress) -> None:
            for hook in self.segment_hooks:
                hook(seg, p)

        def playlist_opened(playlist: LivePlaylist) -> None:
            self.playlist = playlist

        return JobContext(progress=progress, cancelled=cancelled, cost=self.cost,
                          node=self.task.request.hostname, tiled=self.tiled,
                          settings=self.settings, segment_landed=segment_landed,
                          playlist_opened=playlist_opened)


@dataclass(frozen=True)
class Outcome:
    """How one run ends; ``settle`` is the last thing the task does."""

    status: ClassVar[Status]
    error: BaseException | None = None
    result: JobResult | None = None

    def settle(self, run: TaskRun) -> dict[str, Any]:
        """Return the task's return value, or raise what ends the task."""
        raise NotImplementedError


@dataclass(frozen=True)
class Succeeded(Outcome):
    """The job's result, returned to Celery as its JSON form (SUCCESS)."""

    status: ClassVar[Status] = "success"

    def settle(self, run: TaskRun) -> dict[str, Any]:
        assert self.result is not None
        return self.result.model_dump(mode="json")


@dataclass(frozen=True)
class Failed(Outcome):
    """FAILURE with ``error`` (raised ``from cause`` when one is given)."""

    status: ClassVar[Status] = "failure"
    cause: BaseException | None = None

    def settle(self, run: TaskRun) -> NoReturn:
        assert self.error is not None
        if self.cause is not None:
            raise self.error from self.cause
        raise self.error


class Concern:
    """One concern around a run, created per run; every hook does nothing by default."""

    def __init__(self, run: TaskRun) -> None:
        self.run = run

    def before_run(self) -> None:
        """Before the runner starts: register hooks on ``self.run``, or raise to end the run."""

    def on_error(self, error: BaseException) -> Outcome | None:
        """Decide how a run that raised ``error`` ends, or None to leave it to the next."""
        return None

    def on_outcome(self, outcome: Outcome) -> None:
        """Observe how the run ends (it is decided; this cannot change it)."""


def run_concerns(
    run: TaskRun, concerns: Sequence[Callable[[TaskRun], Concern]],
    work: Callable[[JobContext], JobResult],
) -> dict[str, Any]:
    """Run ``work`` inside ``concerns`` (in order) and settle its outcome."""
    active = [make(run) for make in concerns]
    try:
        for concern in active:
            concern.before_run()
        outcome: Outcome = Succeeded(result=work(run.job_context()))
    except BaseException as e:  # noqa: BLE001 - every end goes through the concerns
        outcome = _decide(active, e)
    for concern in active:
        try:
            concern.on_outcome(outcome)
        except Exception:
            log.exception("job %s: %s.on_outcome failed", run.spec.job_id,
                          type(concern).__name__)
    return outcome.settle(run)


def _decide(active: Sequence[Concern], error: BaseException) -> Outcome:
    for concern in active:
        outcome = concern.on_error(error)
        if outcome is not None:
            return outcome
    return Failed(error=error)


class Throttle:
    """Says whether a periodic action is due: at most once every ``period`` seconds, and
    always when ``final`` (the last report must go through)."""

    def __init__(self, period: float) -> None:
        self.period, self.last = period, 0.0

    def due(self, final: bool = False) -> bool:
        now = time.monotonic()
        if final or now - self.last >= self.period:
            self.last = now
            return True
        return False
