"""The one error tree of framefleet, shared by producer and worker.

``RetryableError``: the job may succeed if run again (S3 throttling or 5xx, lost connection,
CUDA out of memory). ``FatalJobError``: running again cannot help (bad input, unknown decoder,
a price the catalog lacks); fatal errors fail the job at once and never loop. Builtins are
inherited where they fit, so callers can also catch ``ValueError`` / ``FileNotFoundError``.

The tree::

    FramefleetError
    ├── RetryableError
    │   ├── StorageError
    │   └── DeviceOutOfMemory
    ├── FatalJobError
    │   ├── InvalidJobError (ValueError)
    │   ├── InputNotFoundError (FileNotFoundError)
    │   ├── JobConflictError
    │   ├── StorageConfigError    no credentials, access denied, no such bucket
    │   ├── NonFiniteOutput       NaN or infinite latents or frames: never a "successful" video
    │   ├── JobStuck              its progress stopped for FRAMEFLEET_STUCK_S (names the stage)
    │   └── PricingError (ValueError)
    │       └── UnknownInstanceTypeError
    ├── JobCancelled              the client asked; neither retried nor a failure
    ├── UnsupportedBackendError   (ValueError) an operator command, not a job
    ├── JobFailed                 the client's view of a job that ended in FAILURE
    ├── UnknownJobError           (LookupError) a job_id that was never submitted
    ├── SettingsError             (ValueError) a FRAMEFLEET_* value is invalid; names it
    ├── LedgerError               the job ledger cannot be read (not set, unreachable, no boto3)
    ├── ApiRequestError           an HTTP request the gateway refuses (status, code, field)
    └── BrokerError               (ConnectionError) the client cannot use Redis
        ├── BrokerUnavailable     nothing answers: refused, timed out, unknown host
        └── BrokerAuthError       the server refused the password, or wants one

This module lives in ``producer`` (not ``worker``) because Celery re-creates a task's exception
on the client by importing its module: the client must be able to import it without torch.
"""

from __future__ import annotations


class FramefleetError(Exception):
    """Base of every error framefleet raises on purpose."""


class RetryableError(FramefleetError):
    """Transient: the task is retried with back-off, up to a cap."""


class FatalJobError(FramefleetError):
    """Permanent: the job fails at once with this message; no retry."""


class InvalidJobError(FatalJobError, ValueError):
    """The job spec or its input is invalid; the message names the field or file."""


class InputTooLarge(InvalidJobError):
    """An input over the byte limit it was read under; the message names the field and file."""


class InputNotFoundError(FatalJobError, FileNotFoundError):
    """The latents object named by ``input.uri`` does not exist."""


class PathRefusedError(InvalidJobError):
    """A local path outside FRAMEFLEET_FILE_ROOTS; the message never says whether it exists."""


class NonFiniteOutput(FatalJobError):
    """A stage made NaN or infinite values: the denoise's final latents, or a decoded chunk.

    The job fails naming the stage and the tier or decoder that made them, before anything
    of them is encoded; no retry (the same job on the same weights repeats it)."""


class JobStuck(FatalJobError):
    """A run of the job made no progress for ``FRAMEFLEET_STUCK_S``: its pool process was
    retired (its stacks are in that worker's log), and the job's next delivery fails with the
    stage it stopped in (``stuck in decode``) instead of holding another GPU as long."""


class JobConflictError(FatalJobError):
    """A ``job_id`` was reused with a different spec."""


class PricingError(FatalJobError, ValueError):
    """A price is missing or invalid, or the override file is malformed; names the entry.

    Fatal: a job that needs a price would read the same catalog on every retry.
    """


class UnknownInstanceTypeError(PricingError):
    """The instance type is not in the catalog (nor in the override file)."""


class JobCancelled(FramefleetError):
    """The job was cancelled by the client; it stopped between chunks and wrote no manifest."""


class LeaseLost(FramefleetError):
    """This run no longer holds its job's lease: it was taken for lost (a partition, a stall
    longer than the lease) and the job delivered again. It stops and writes nothing more;
    the run that took the job over ends it. Neither retryable nor fatal: no end of the job."""


class StorageError(RetryableError):
    """An object store call failed in a way that may pass on retry (5xx, throttling, network)."""


class DeviceOutOfMemory(RetryableError):
    """The GPU ran out of memory; retried once with a smaller working set."""


class UnsupportedBackendError(FramefleetError, ValueError):
    """An operator tool cannot work on this result backend (``cost report`` scans Redis only).

    Not a job's error: it is raised on the command line, before any job is read.
    """


class JobFailed(FramefleetError):
    """Raised by ``JobHandle.wait`` when the job ended in FAILURE; carries the worker's message."""

    def __init__(self, job_id: str, kind: str, message: str) -> None:
        super().__init__(f"job {job_id} failed: {kind}: {message}")
        self.job_id = job_id
        self.kind = kind
        self.message = message


class StorageConfigError(FatalJobError):
    """The object store refuses the job for a reason no retry can change: no credentials,
    access denied (wrong keys or policy), no such bucket. Names the object."""


class UnknownJobError(FramefleetError, LookupError):
    """A ``job_id`` that was never submitted, or whose record has expired."""


class SettingsError(FramefleetError, ValueError):
    """A ``FRAMEFLEET_*`` environment value is invalid; the message names the variable."""


class LedgerError(FramefleetError):
    """The durable job ledger (``FRAMEFLEET_LEDGER_URI``) cannot be read: not configured,
    unreachable, or boto3 missing for an ``s3://`` one. Names the URI."""


class BrokerError(FramefleetError, ConnectionError):
    """The client cannot use the broker or the result backend.

    The message is one line: which one, its URL with the password masked, and the cause.
    """


class BrokerUnavailable(BrokerError):
    """Nothing usable answers at the URL: connection refused, timed out, unknown host."""


class BrokerAuthError(BrokerError):
    """The server refused the credentials of the URL, or requires a password it lacks."""


class ApiRequestError(FramefleetError):
    """A request ``framefleet api`` refuses: the HTTP ``status``, a machine-readable ``code``
    and, where one field is at fault, its name (``param``); the gateway answers it as JSON in
    the OpenAI error shape. ``headers`` go out with it (``Retry-After``)."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param
        self.headers = headers or {}
