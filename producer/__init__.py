"""framefleet producer: the wire format and the light client (no torch, av, boto3 or worker)."""

from producer.errors import FatalJobError, FramefleetError, JobCancelled, RetryableError
from producer.spec import JobResult, JobSpec

__all__ = [
    "FatalJobError",
    "FramefleetError",
    "JobCancelled",
    "JobResult",
    "JobSpec",
    "RetryableError",
]
