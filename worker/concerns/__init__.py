"""The task's concerns: small objects around one run of a job, one module each.

The task body (``worker.tasks``) only parses, claims, leases and runs; everything a run needs
around it (progress, cancel and preemption, the worker-loss cap, the OOM fallback, retries,
metrics, failed previews, ending the live playlist, webhooks, the ledger record of its end, the
memory guard, the stuck-job watchdog) is a concern, in the manner of Dramatiq's middleware.

The interface (``worker.concerns.base``):

- ``Run`` (``worker.run``, no Celery): one run of one job: the spec, the worker's settings,
  the node name, the job's counters (``error_retries``, ``requeues``: see ``retries``), and
  three lists a concern may append to in ``before_run``: ``progress_hooks`` (called with each
  ``Progress``), ``cancel_checks`` (polled between steps and chunks; one ``True`` stops the run
  with ``JobCancelled``), ``guards`` (called at the same polls; one raises to stop the run) and
  ``segment_hooks`` (each segment the live playlist lists); the run
  leaves its live ``playlist`` on it.
- ``Concern``: created once per run as ``Concern(run, task)`` (so it may keep that run's state
  on ``self``); ``task`` is the Celery task executing it, ``flags`` the job registry. Three
  hooks, each a no-op by default:

  - ``before_run()``: before the runner starts. May register hooks, or raise: an error
    raised here ends the run like one from the runner (it goes through ``on_error``).
  - ``on_error(error) -> Outcome | None``: the run raised ``error``. Return an ``Outcome``
    to decide how the run ends, or None to leave it to the next concern. The first answer
    wins; no answer means ``Failed(error)``.
  - ``on_outcome(outcome)``: the run's end is decided (success, failure, retry, cancelled):
    observe it (metrics, notifications). It cannot change the outcome; an exception here is
    logged and ignored.

- ``Outcome``: how a run ends: ``status`` (what ``on_outcome`` sees: success, failure, retry,
  cancelled), ``error``/``result``, and ``settle(run, task)``, which the task does last: return the
  result, or raise the error, Celery's Retry (``retries.Retry``/``Requeue``) or Ignore
  (``cancel.Revoked``). A new kind of end is a new ``Outcome`` subclass in its concern's
  module.

A new concern is a module of this package with a ``Concern`` subclass, added to ``CONCERNS``
below. The order matters for ``on_error`` only: a concern for a specific error comes before a
general one (``DeviceOutOfMemory`` is a ``RetryableError``, so ``OomFallback`` comes before
``Retries``).
"""

from __future__ import annotations

from worker.concerns.base import Concern, Failed, Outcome, Succeeded, run_concerns
from worker.concerns.cancel import CancelAndPreempt
from worker.concerns.device import DeviceErrors
from worker.concerns.fencing import Fencing
from worker.concerns.ledger import JobLedger
from worker.concerns.losses import WorkerLosses
from worker.concerns.memory import MemoryGuard
from worker.concerns.metrics import JobMetrics
from worker.concerns.notify import Notifications
from worker.concerns.oom import OomFallback
from worker.concerns.playlist import EndPlaylist
from worker.concerns.previews import PreviewFailures
from worker.concerns.progress import ProgressReport
from worker.concerns.retries import Retries
from worker.concerns.stuck import StuckWatch

#: The task's concerns, in the order ``before_run`` and ``on_error`` ask them.
CONCERNS: tuple[type[Concern], ...] = (
    Fencing,  # first: a zombie's error is no job's end, whatever it is
    ProgressReport,
    CancelAndPreempt,
    WorkerLosses,
    DeviceErrors,  # before the retries: a CUDA error ends the process, not just the run
    OomFallback,
    Retries,
    JobMetrics,
    PreviewFailures,
    EndPlaylist,  # before Notifications: a `failed` webhook finds the playlist ended
    Notifications,
    JobLedger,  # the record of the end, once the webhooks are on their way
    MemoryGuard,  # after a job it stopped, it frees the job's memory
    StuckWatch,  # last: armed once every hook is in, disarmed once every end is seen
)

__all__ = ["CONCERNS", "Concern", "Failed", "Outcome", "Succeeded", "run_concerns"]
