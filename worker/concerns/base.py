"""The concern interface: ``Concern``, ``Outcome`` and the loop that runs them around a ``Run``.

See the package docstring for how a concern plugs in.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, NoReturn

from celery import Task

from producer.errors import LeaseLost
from producer.state.control import Flags, flags_for
from producer.wire.spec import JobResult
from worker.run.run import Run

log = logging.getLogger(__name__)

#: ``fenced``: the run lost its job's lease (``worker.concerns.fencing``): no end of the job.
Status = Literal["success", "failure", "retry", "cancelled", "fenced"]


@dataclass(frozen=True)
class Outcome:
    """How one run ends; ``settle`` is the last thing the task does."""

    status: ClassVar[Status]
    #: The run ends as a loss of its process: its run record stays for the poison cap.
    lost: ClassVar[bool] = False
    error: BaseException | None = None
    result: JobResult | None = None

    def settle(self, run: Run, task: Task) -> dict[str, Any]:
        """Return the task's return value, or raise what ends the task."""
        raise NotImplementedError


@dataclass(frozen=True)
class Succeeded(Outcome):
    """The job's result, returned to Celery as its JSON form (SUCCESS)."""

    status: ClassVar[Status] = "success"

    def settle(self, run: Run, task: Task) -> dict[str, Any]:
        assert self.result is not None
        return self.result.model_dump(mode="json")


@dataclass(frozen=True)
class Failed(Outcome):
    """FAILURE with ``error`` (raised ``from cause`` when one is given)."""

    status: ClassVar[Status] = "failure"
    cause: BaseException | None = None

    def settle(self, run: Run, task: Task) -> NoReturn:
        assert self.error is not None
        if self.cause is not None:
            raise self.error from self.cause
        raise self.error


class Concern:
    """One concern around a run, created per run; every hook does nothing by default.

    ``run`` is the job's ``Run`` (its hooks, settings, registry); ``task`` the Celery task
    executing it (its request, its app's backend; ``update_state``, ``retry``).

    A run that lost its lease (a zombie, ``Fenced``) touches nothing shared: only the
    concerns with ``sees_fenced`` (local bookkeeping: device time, memory, the watchdog)
    observe that outcome."""

    #: ``on_outcome`` is called for a ``Fenced`` outcome too.
    sees_fenced: ClassVar[bool] = False

    def __init__(self, run: Run, task: Task) -> None:
        self.run = run
        self.task = task

    @property
    def node(self) -> str:
        """The worker's node name (``gpu0@host``)."""
        return str(self.task.request.hostname)

    @functools.cached_property
    def flags(self) -> Flags:
        """The job registry and its flags (cancel, preempted, run records)."""
        return flags_for(self.task.app, self.run.settings)

    def before_run(self) -> None:
        """Before the runner starts: register hooks on ``self.run``, or raise to end the run."""

    def on_error(self, error: BaseException) -> Outcome | None:
        """Decide how a run that raised ``error`` ends, or None to leave it to the next."""
        return None

    def on_outcome(self, outcome: Outcome) -> None:
        """Observe how the run ends (it is decided; this cannot change it)."""


def run_concerns(
    run: Run, task: Task, concerns: Sequence[Callable[[Run, Task], Concern]],
    work: Callable[[], JobResult],
) -> dict[str, Any]:
    """Run ``work`` inside ``concerns`` (in order) and settle its outcome."""
    active = [make(run, task) for make in concerns]
    try:
        for concern in active:
            concern.before_run()
        result = work()
        if run.fence is not None:  # the end lands only while the run holds its lease
            run.fence.check(f"job {run.spec.key}: its end")
        outcome: Outcome = Succeeded(result=result)
    except (SystemExit, KeyboardInterrupt):
        # The process is going away (billiard turns the SIGTERM of Celery's hard time limit
        # or of a shutdown into SystemExit): no end of the job. Its run record stays, and the
        # end is decided elsewhere (the hard limit's in the main process; a lost worker's
        # message comes back).
        raise
    except BaseException as e:  # noqa: BLE001 - every end goes through the concerns
        outcome = _decide(active, e)
    for concern in active:
        if outcome.status == "fenced" and not concern.sees_fenced:
            continue
        try:
            concern.on_outcome(outcome)
        except Exception:
            log.exception("job %s: %s.on_outcome failed", run.spec.key,
                          type(concern).__name__)
    if outcome.status != "fenced" and getattr(run.fence, "lost", False):
        # The lease was lost while the end was being recorded (every record of it fenced,
        # refused): this run's end is none, and Celery must neither store nor log one.
        outcome = _decide(active, LeaseLost(f"job {run.spec.key}: its {outcome.status} "
                                            "came after this run lost the job's lease"))
    return outcome.settle(run, task)


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
