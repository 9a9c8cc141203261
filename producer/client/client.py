"""The light client: submit JobSpecs, follow their progress, fetch results, cancel.

Imports no torch, av, boto3 or worker code; it only speaks the wire format of
``producer.wire.spec``.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from celery import Celery
from celery.result import AsyncResult

from producer.app import make_app
from producer.client.bulk import Submitted, submit_many
from producer.client.conflict import conflict
from producer.client.connection import bound_client_app
from producer.client.handle import JobHandle, _io, _unknown
from producer.client.jobstate import FINISHED, JobState
from producer.client.send import send_job
from producer.errors import InvalidJobError
from producer.settings import Settings, get_settings
from producer.state.control import Flags, flags_for
from producer.wire.rules import (
    LocalPathWarning,
    check_local_files,
    check_local_paths,
    check_spec,
)
from producer.wire.spec import JobSpec, job_key, split_key

# Resubmitting a job that ended without an output runs it again: FAILURE, and REVOKED too.
# A cancel stops a run; it does not retire the job_id, which names the job's output folder,
# so the same spec submitted again after a cancel is a deliberate request to run it. This is
# why cancel sets a flag and never calls Celery's revoke (workers would remember the id and
# drop every later run of it), and why the workers take Celery's revoke (Flower's button,
# `celery control revoke`) as this cancel too (``worker.concerns.cancel``).
RERUNNABLE = {"FAILURE", "REVOKED"}


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
        withdraws the cancel. The same job_id with a different spec raises JobConflictError
        naming the fields that differ. A spec the fleet's rules refuse (``producer.wire.rules``:
        no ``decoder.weights`` for a Wan decoder, a ``file://`` path outside this producer's
        ``FRAMEFLEET_FILE_ROOTS``, …) raises InvalidJobError before anything is queued, and so
        does a local input file or folder that is missing where this host can see it
        (``InputNotFoundError``, ``producer.wire.rules.check_local_files``); local paths that only
        the workers can judge (no roots set here) give a ``LocalPathWarning``."""
        with _io(self.app):
            return self._submit(spec)

    def _submit(self, spec: JobSpec) -> JobHandle:
        self.check(spec)
        payload = spec.model_dump(mode="json")
        digest, key = spec.digest(), spec.key
        flags = flags_for(self.app, self.settings)
        existing = flags.claim(key, digest, clear_cancel=True,
                               spec_json=json.dumps(payload, separators=(",", ":")))
        handle = JobHandle(self.app, key, flags, self.settings)
        if existing is not None and not self.again(spec, digest, existing, flags, handle):
            return handle  # queued, running or finished: the existing job
        self.send(spec, payload, flags, existing is None)
        flags.mark_sent(key)  # how long it waits: the hints of status and wait
        handle.reached = True
        return handle

    def check(self, spec: JobSpec) -> None:
        """What ``submit`` checks before it claims anything (``InvalidJobError``,
        ``InputNotFoundError``; ``LocalPathWarning`` for what only the workers can judge)."""
        check_spec(spec, self.settings)  # the worker checks again on receipt
        for warning in check_local_paths(spec, self.settings):
            warnings.warn(warning, LocalPathWarning, stacklevel=5)
        check_local_files(spec, self.settings)  # a missing file where it is visible here

    def again(self, spec: JobSpec, digest: str, existing: str, flags: Flags,
              handle: JobHandle) -> bool:
        """A job_id claimed before: whether to send its message again (FAILURE or REVOKED,
        received and its result expired since, or claimed and never sent). Raises
        ``JobConflictError`` for another spec; marks ``handle`` reached for the existing job."""
        if existing != digest:
            raise conflict(spec, flags.first_spec(spec.key))
        key = spec.key
        state = handle.status()
        if state in RERUNNABLE:
            flags.reset_runs(key)
            AsyncResult(key, app=self.app).forget()
        elif not (state == "PENDING" and (flags.take_started(key) or
                                          flags.sent_at(key) is None)):
            if state not in FINISHED and flags.cancelled(key):
                # Cancelled, not stopped yet: submitting again means "run it after all".
                flags.clear_cancel(key)
            handle.reached = True
            return False
        # else a worker received it and its result has expired since: send it again (the
        # worker returns the output still stored as ``reused``, or runs it if it is gone);
        # or it was claimed and never sent (the broker went away in between): send it.
        flags.clear_cancel(key)
        return True

    def send(self, spec: JobSpec, payload: dict[str, Any], flags: Flags, new: bool) -> None:
        """Put the message on the queue; if it fails, nothing was queued: a ``new`` claim is
        freed (or a resubmission would wait forever), an old one is marked for the next
        resubmit to send it again."""
        try:
            send_job(self.app, spec, payload, self.settings)
        except BaseException:
            if new:
                flags.release(spec.key)
            else:
                flags.mark_started(spec.key, taken=False)
            raise

    def submit_many(self, specs: Iterable[JobSpec],
                    done: Callable[[int], None] | None = None) -> list[Submitted]:
        """Submit many jobs at once, each with every guarantee of ``submit`` (its checks, the
        claim of its job_id, the same answer for the same spec submitted again, a conflict
        for another), at a few Redis round trips per hundred jobs instead of three per job.

        Returns one ``Submitted`` per spec, in order: its handle, or the error that refused
        it (a refusal is that spec's alone; the others go on). ``done(n)`` is called as
        specs are dealt with (n: how many so far). A broker that stops answering refuses
        the specs not yet queued with its error (``producer.client.bulk``)."""
        return submit_many(self, list(specs), done)

    def get(self, job: str, tenant: str | None = None) -> JobHandle:
        """The handle of a submitted job: ``job`` is its key (``tenant:job_id``, or a bare
        ``job_id`` of ``tenant``, by default the default tenant)."""
        return JobHandle(self.app, _key(job, tenant), flags_for(self.app, self.settings),
                         self.settings)

    def state(self, job: str, tenant: str | None = None) -> JobState:
        """``get(job, tenant).state()``: UNKNOWN, QUEUED, STARTED, PROGRESS, RETRY, SUCCESS, …"""
        return self.get(job, tenant).state()

    def cancel(self, job: str, tenant: str | None = None) -> str:
        """Cooperative cancel: the worker stops between chunks, writes no manifest, and the
        job ends REVOKED; a job still queued ends so when a worker receives it.

        Returns the job's state when asked, as ``state()`` names it (QUEUED, STARTED,
        PROGRESS, RETRY, …). A finished job is left as it is. Raises
        ``UnknownJobError`` for an id that was never submitted: nothing is flagged.
        """
        with _io(self.app):
            flags = flags_for(self.app, self.settings)
            handle = JobHandle(self.app, _key(job, tenant), flags, self.settings)
            # The state as status and wait name it (QUEUED, not Celery's PENDING).
            state = handle.state().state
            if state == "UNKNOWN":
                raise _unknown(handle.key, self.app)
            if state not in FINISHED:
                flags.set_cancel(handle.key)
            return state

    def ping(self, timeout: float = 1.0) -> list[dict[str, Any]]:
        """Workers that answer a broadcast ping."""
        with _io(self.app):
            return list(self.app.control.ping(timeout=timeout) or [])


def _key(job: str, tenant: str | None) -> str:
    """The key of ``job`` (a key, or a job_id of ``tenant``); ``InvalidJobError`` naming
    what is wrong."""
    try:
        return job_key(*split_key(job, tenant))
    except ValueError as e:
        raise InvalidJobError(str(e)) from None
