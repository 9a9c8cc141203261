"""What a client reads of why a job failed, retries or was requeued: a stable ``code`` and a
short message, never a worker's raw exception.

The fleet keeps the reason as ``Type: message``. Only the errors whose messages are written
for the job's sender, naming a field or the sender's own input (``InvalidJobError``,
``InputNotFoundError``, ``JobConflictError``), pass through. Every other reason gets a fixed
message for its code: a ``RuntimeError: shape '[1, 45, 1, -1]' is invalid…`` from inside a
model, an S3 error naming the fleet's bucket, or a worker's memory figures say nothing a
client can act on and something about the fleet. The detail stays where the operator looks:
the worker's log, which has the message and its traceback under the job's id.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from producer.client.jobstate import JobState

#: Longest message that passes through (a spec error names a field; it is never long).
MAX_MESSAGE = 300
# "InvalidJobError: generate.num_frames: ...": a class name, then the message.
_TYPED = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*): (.*)$", re.DOTALL)


@dataclass(frozen=True)
class Failure:
    code: str
    message: str


#: Errors whose message is written for the job's sender: code, and the message as it is.
PASS = {"InvalidJobError": "invalid_job", "PathRefusedError": "invalid_job",
        "InputNotFoundError": "input_not_found", "JobConflictError": "conflict"}
#: Every other known reason: a code and a fixed message.
FIXED = {
    "StorageError": Failure("storage_error", "the object store kept failing for this job"),
    "StorageConfigError": Failure("storage_error", "the object store refused this job"),
    "DeviceOutOfMemory": Failure("out_of_memory", "the job did not fit in the GPU's memory"),
    "SoftTimeLimitExceeded": Failure("time_limit", "the job ran past its time_limit_s"),
    "TimeLimitExceeded": Failure("time_limit", "the job ran past its time_limit_s"),
    "WorkerLostError": Failure("worker_lost", "the job's worker was lost"),
    "FatalJobError": Failure("job_failed", "the fleet could not run this job"),
}
#: A requeue by the host-loss sweep (its reason is the fleet's own sentence).
REQUEUED = Failure("worker_lost", "the job's worker was lost; it waits for another")
#: Anything else: an exception nobody raised on purpose.
UNEXPECTED = Failure("internal_error", "the job failed on its worker (the worker's log has the "
                     "detail)")


def failure(js: JobState) -> Failure | None:
    """The code and message of ``js``'s reason, for a client (None: it has none)."""
    if js.reason is None:
        return None
    if js.state == "REQUEUED":
        return REQUEUED
    typed = _TYPED.match(js.reason)
    if typed is None:
        return UNEXPECTED
    kind, message = typed.groups()
    if kind in PASS:
        text = " ".join(message.split())
        if len(text) > MAX_MESSAGE:
            text = text[:MAX_MESSAGE - 1] + "…"
        return Failure(PASS[kind], text)
    return FIXED.get(kind, UNEXPECTED)


def reason(js: JobState) -> str | None:
    """The reason's message for a client."""
    found = failure(js)
    return found.message if found is not None else None


def describe(js: JobState) -> str:
    """``JobState.describe`` with the reason as a client may read it."""
    found = failure(js)
    if found is None or js.state not in ("RETRY", "REQUEUED", "FAILURE"):
        return js.describe()
    word = {"RETRY": "retrying", "REQUEUED": "requeued", "FAILURE": "failed"}[js.state]
    return f"{word}: {found.message}"
