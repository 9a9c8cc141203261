"""The Celery task ``framefleet.decode_video``: parse → check → claim → lease → run → result.

- Fatal errors (bad spec, bad input) → FAILURE at once, with the message; no retry.
- A message whose task id is not its spec's key (``tenant:job_id``, ``producer.wire.spec.job_key``)
  fails naming both, unless that id is a submitted job's: a message that is not the job its
  id names (another spec's key, a job's key with another spec, no job at all) is then dropped
  with a critical log, and nothing is stored under the id: no sender can overwrite another
  job's result. Not even STARTED: Celery's ``track_started`` would store it before the
  check, so the task stores it itself once it holds the job's lease.
- A duplicate delivery of a job that already ended (succeeded, failed, cancelled) is dropped:
  on receipt, and again once it holds the job's lease, which a run lets go only after
  Celery has stored the job's state.
- A job that another worker runs right now (its lease is held) waits in the queue: a requeue,
  counted apart from the retries of errors (``worker.concerns.retries``).
- A job whose ``output.uri`` is outside ``FRAMEFLEET_OUTPUT_PREFIX`` (when set) fails at once.
- Everything around the run (progress, cancel and preemption, the worker-loss cap, the OOM
  fallback, retries with back-off, metrics) is a concern of ``worker.concerns``.
- A run that loses its lease (a zombie: its host cut off longer than the lease while the job
  ran again elsewhere) stops and ends without an end: every shared write checks the lease's
  generation (``worker.concerns.fencing``), Celery's result store included
  (``worker.concerns.fenced_results``).
- A CUDA error ends this pool process once the job's lease is released: its CUDA context is
  gone, and Celery redelivers the job to a fresh one (``worker.concerns.device``).
- A job failed for good outside the concerns (refused by the fleet's rules on receipt;
  requeued too often while another run held its lease; Celery's hard time limit, decided in
  the worker's main process: ``DecodeRequest``) still gets its one count and ledger record
  (``worker.concerns.outside``) and its live playlist ended
  (``worker.concerns.playlist.end_later``).

Nothing is registered at import: ``register(app)`` adds the task to an app built by
``producer.app.make_app`` (the worker entry point ``worker.lifecycle.main`` does).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Any, NoReturn

from celery import Celery, Task, states
from celery.exceptions import Ignore, TimeLimitExceeded
from celery.signals import task_postrun, worker_process_init
from celery.worker import state as worker_state
from celery.worker.request import Request

from producer.app import ENQUEUED_AT_HEADER, TASK_NAME
from producer.cost import cost_for_job
from producer.errors import FatalJobError, InvalidJobError, JobConflictError
from producer.settings import Settings, get_settings
from producer.state.control import Flags, flags_for
from producer.wire.rules import check_message_size, check_spec, time_limits
from producer.wire.spec import JobSpec, parse_spec
from worker.concerns import CONCERNS, run_concerns
from worker.concerns.device import RetireProcess, retire
from worker.concerns.fenced_results import fenced_backend, hold, let_go
from worker.concerns.lease import LEASE_RETRY_S, JobLease, still_the_run, through_failover
from worker.concerns.metrics import as_stamp, enqueued_at, failed_before_run
from worker.concerns.outside import failed_outside, hand_over, record_end, take_over
from worker.concerns.playlist import end_later
from worker.concerns.retries import requeue_now
from worker.run import DecoderCache, Run, default_decoders, run_job

log = logging.getLogger(__name__)
_decoders: DecoderCache | None = None


def init_decoders(settings: Settings) -> DecoderCache:
    """Build this process's decoder cache (the worker's pool process calls it at start)."""
    global _decoders
    _decoders = default_decoders(settings)
    return _decoders


def decoders() -> DecoderCache:
    """This process's decoder cache, built on first use if ``init_decoders`` did not run."""
    global _decoders
    if _decoders is None:
        _decoders = default_decoders()
    return _decoders


def register(app: Celery) -> Task:
    """Register ``decode_video`` on ``app`` only, under ``TASK_NAME``; returns the task.

    ``shared=False``: Celery's default would also add the task to every other app finalized
    in this process (a client's, the dashboard's). ``throws``: a fatal job error (bad input,
    a path outside the file roots, the store's configuration) is the job's answer, not a bug:
    Celery logs it as one line with the job's id and the message, without a traceback.
    ``track_started=False``: Celery would store STARTED under the message's task id before
    the task could check that the message is the job its id names; the task stores STARTED
    itself once it holds the job (``_started``).
    """
    task: Task = app.task(bind=True, base=DecodeTask, name=TASK_NAME, acks_late=True,
                          reject_on_worker_lost=True, shared=False, lazy=False,
                          track_started=False, throws=(FatalJobError,))(decode_video)
    # A pool process that starts (one replacing a process the hard time limit killed, say)
    # records the job ends its main process handed over: from a thread, since a pool process
    # that takes too long to start (a ledger write) is killed by Celery before it is up.
    worker_process_init.connect(lambda **_: threading.Thread(
        target=take_over_ends, args=(app,), name="job-ends", daemon=True).start(), weak=False)
    task_postrun.connect(_release_lease, weak=False, dispatch_uid="framefleet-job-lease")
    return task


class DecodeRequest(Request):  # type: ignore[misc]
    """The job's request in the worker's main process.

    Its time limits come from the spec (``producer.wire.rules.time_limits``), never from the
    message: a message aimed at another job with a limit of a millisecond would have Celery
    store that job's FAILURE and kill the pool process. And it ends what Celery's hard time
    limit ends there (the pool process that ran the job is killed, no concern of its run ends
    it): the live playlist, the count and the ledger record (``worker.concerns.outside``)."""

    def __init__(self, message: Any, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.time_limits = time_limits(self.args[0] if self.args else None, get_settings())

    def on_timeout(self, soft: bool, timeout: float) -> None:
        client = getattr(self.task.app.backend, "client", None)
        if not soft and self.worker_pid is not None and not still_the_run(
                client, str(self.id), str(self.hostname), int(self.worker_pid)):
            log.warning("job %s: hard time limit of a run that lost the job to another run "
                        "(this host was taken for lost): its process is ended, nothing stored",
                        self.id)
            return
        super().on_timeout(soft, timeout)
        if soft or worker_state.should_terminate:  # Celery stored nothing: a cold shutdown
            return
        try:
            _killed(self, timeout)
        except Exception:  # the job's FAILURE is stored already: log, go on
            log.exception("job %s: hard time limit: its end was not recorded", self.id)


class DecodeTask(Task):
    """The task's class: its requests are ``DecodeRequest``s, and its states are stored only
    while its run holds the job's lease (``worker.concerns.fenced_results``)."""

    Request = DecodeRequest

    @property
    def backend(self) -> Any:
        backend: Any = getattr(self, "_backend", None)
        if backend is None:
            backend = fenced_backend(self.app)
            self.backend = backend
        return backend

    @backend.setter
    def backend(self, value: Any) -> None:
        self._backend = value


def _killed(request: DecodeRequest, timeout: float) -> None:
    settings = get_settings()
    app = request.task.app
    client = getattr(app.backend, "client", None)
    spec = _decode(request.args[0], settings)
    if spec.key != request.id:  # not the job it names: dropped on receipt, nothing to end
        return
    # The lease names the killed run's node; this one waits for it to expire.
    end_later(spec, settings, client, f"hard-limit@{socket.gethostname()}")
    flags = flags_for(app, settings)
    if request.worker_pid is None or not flags.end_killed_run(
            spec.key, str(request.hostname), int(request.worker_pid)):
        return  # its run ended itself (and was counted), or never started
    kwargs = request.kwargs or {}
    hand_over(failed_outside(
        spec, TimeLimitExceeded(f"hard time limit ({timeout:g} s) exceeded"),
        str(request.hostname), started_at=request.time_start,
        enqueued_at=as_stamp(request.request_dict.get(ENQUEUED_AT_HEADER)),
        error_retries=int(kwargs.get("error_retries", 0)),
        requeues=int(kwargs.get("requeues", 0))), flags, settings)


def take_over_ends(app: Celery) -> int:
    """Record the job ends a main process handed over (``worker.concerns.outside``): a pool
    process does at its start (from a thread), and the task before each job."""
    settings = get_settings()
    return take_over(flags_for(app, settings), settings, getattr(app.backend, "client", None))


def decode_video(self: Task, payload: Any, tiled: bool = False, error_retries: int = 0,
                 requeues: int = 0) -> dict[str, Any]:
    """Run one job; ``tiled`` is set by the OOM fallback's requeue, the two counters by every
    send after the first (``worker.concerns.retries``)."""
    settings = get_settings()
    flags = flags_for(self.app, settings)
    take_over_ends(self.app)
    spec = _received(self, payload, settings, flags)
    lease = JobLease(getattr(self.app.backend, "client", None), spec.key,
                     str(self.request.hostname))
    if not lease.acquire():
        _wait_for_lease(self, spec, int(error_retries), int(requeues), settings)
    hold(str(self.request.id), lease)
    try:
        # Again, now that no other run can end the job meanwhile: a duplicate delivery that
        # passed the claim while another run was ending the job finds that end here.
        through_failover(lambda: _drop_if_ended(self.app, spec), f"job {spec.key}: ended?")
        _started(self)
        run = Run(spec=spec, settings=settings, node=str(self.request.hostname), tiled=tiled,
                  cost=cost_for_job, error_retries=int(error_retries), requeues=int(requeues),
                  fence=lease)
        return run_concerns(run, self, CONCERNS, lambda: run_job(spec, decoders(), run))
    except RetireProcess as e:  # a CUDA error: free the job for its next run, then go
        _release_lease(str(self.request.id))
        retire(e)


def _release_lease(task_id: str | None = None, **_: Any) -> None:
    """Release the lease of the job this pool process ran. Once Celery has stored the job's
    state (``task_postrun`` comes after the store, whatever the end), not when the task
    function returns: Celery stores SUCCESS and FAILURE after that, and a duplicate delivery
    taking the lease in between would find no end and run the job again."""
    lease = let_go(str(task_id))
    if lease is not None:
        lease.release()


def _started(task: Task) -> None:
    """STARTED with Celery's own payload (``pid``, ``hostname``), stored only now: the message
    is the job its id names, claimed with this spec, and this run holds the job's lease (a
    duplicate delivery waiting for it overwrites nothing of the run that holds it)."""
    task.update_state(state=states.STARTED,
                      meta={"pid": os.getpid(), "hostname": str(task.request.hostname)})


def _wait_for_lease(task: Task, spec: JobSpec, error_retries: int, requeues: int,
                    settings: Settings) -> NoReturn:
    """Another worker runs this job right now: look again later instead of running twice.
    Requeued too often, the job fails for good: counted and recorded, and its live playlist
    is ended once the run that holds the lease lets it go."""
    client = getattr(task.app.backend, "client", None)
    try:
        requeue_now(task, spec.key, requeues, settings, countdown=LEASE_RETRY_S,
                    why="its lease is held by another run")
    except FatalJobError as e:
        node = str(task.request.hostname)
        end_later(spec, settings, client, node)
        record_end(failed_outside(spec, e, node, enqueued_at=enqueued_at(task.request),
                                  error_retries=error_retries, requeues=requeues),
                   settings, client)
        raise


def _received(task: Task, payload: Any, settings: Settings, flags: Flags) -> JobSpec:
    """The spec of this message, checked and claimed; a job that cannot run ends here.

    An error raised here is stored as the FAILURE of the message's task id, so a message
    that is not the job its id names (a raw message aimed at another tenant's job, say) is
    dropped instead, with a critical log: its sender must not overwrite that job's result."""
    task_id = str(task.request.id)
    try:
        spec = _decode(payload, settings)
    except InvalidJobError as e:  # no job: it never runs, and still ends: count it
        failed_before_run(e, None, settings)
        if flags.registered(task_id) is not None:
            _foreign(task_id, f"a message that is not a job ({e}) names the job {task_id}")
        raise
    if spec.key != task_id:
        error = InvalidJobError(f"task id {task_id!r} is not the job's key {spec.key!r} "
                                "(tenant:job_id, or the job_id for the default tenant)")
        failed_before_run(error, spec, settings)
        if flags.registered(task_id) is not None:
            _foreign(task_id, f"its spec is job {spec.key}, not {task_id}")
        raise error
    try:
        check_spec(spec, settings)  # the client's rules, again: the wire is not trusted
    except FatalJobError as e:
        if flags.registered(task_id) not in (None, spec.digest()):
            failed_before_run(e, spec, settings)
            _foreign(task_id, f"its spec breaks the rules ({e}) and is not the job {task_id}")
        # The job itself, refused: one end like any other, counted and recorded.
        record_end(failed_outside(spec, e, str(task.request.hostname),
                                  enqueued_at=enqueued_at(task.request)),
                   settings, getattr(task.app.backend, "client", None))
        raise
    try:
        through_failover(lambda: _claim(task.app, flags, spec), f"job {spec.key}: claim")
    except JobConflictError as e:
        failed_before_run(e, spec, settings)
        _foreign(task_id, str(e))
    return spec


def _foreign(task_id: str, why: str) -> NoReturn:
    log.critical("message for task %s dropped, nothing stored: %s", task_id, why)
    raise Ignore()


def _decode(payload: Any, settings: Settings) -> JobSpec:
    # The size first: a huge message is refused before pydantic spends time on it.
    check_message_size(payload, settings)
    return parse_spec(payload)


def _claim(app: Celery, flags: Flags, spec: JobSpec) -> None:
    """Register the job's key → spec digest; refuse a reused job_id (another spec), drop a
    finished duplicate."""
    digest, key = spec.digest(), spec.key
    registered = flags.claim(key, digest)
    if registered is not None and registered != digest:
        raise JobConflictError(f"job_id {spec.job_id!r} of tenant {spec.tenant!r} was already "
                               "used by a different spec")
    # Received: from now on, a PENDING state of this job means its result expired (the
    # client's resubmit then sends it again, see producer.client).
    flags.mark_started(key)
    _drop_if_ended(app, spec)


def _drop_if_ended(app: Celery, spec: JobSpec) -> None:
    """Drop this delivery (``Ignore``) if the job has ended: a duplicate."""
    key, digest = spec.key, spec.digest()
    meta = app.backend.get_task_meta(key)
    result = meta.get("result")
    manifest = result.get("manifest") if isinstance(result, dict) else None
    if (meta.get("status") == "SUCCESS" and isinstance(manifest, dict)
            and manifest.get("spec_digest") == digest):
        # A duplicate delivery (kombu restores unacked messages after a lost connection).
        log.warning("job %s already succeeded: duplicate delivery dropped", key)
        raise Ignore()
    if meta.get("status") in (states.FAILURE, states.REVOKED):
        # Ended without an output: a resubmit forgets that result before it sends (the
        # client), so a message that finds it is a duplicate (a message the lost-message
        # reconciler sent again while the first was hidden): it must not end the job twice.
        log.warning("job %s already ended %s: duplicate delivery dropped", key, meta["status"])
        raise Ignore()
