"""framefleet's light side: what a producer, an operator and both ends of the wire share.

- ``spec``: the wire format, frozen pydantic models sent as JSON (``JobSpec`` in,
  ``Progress`` and ``JobResult`` back, ``Manifest`` next to the output).
- ``settings``: every ``FRAMEFLEET_*`` variable, documented and range-checked; read nowhere else.
- ``errors``: the one error tree (``RetryableError`` / ``FatalJobError`` under
  ``FramefleetError``).
- ``app``: the Celery app factory, where the fleet's delivery semantics are configured.
- ``client``: submit, follow, cancel; ``control``: the job registry and cancel/preempt flags;
  ``jobstate``: what a job is doing (UNKNOWN and QUEUED told apart); ``connection``: bounded
  Redis waits and one-line broker errors; ``weights``: which decoders need weights.
- ``cost``, ``fleet``: the price catalog, per-job and fleet cost-to-serve.
- ``cli``, ``cli_cost``, ``cli_help``, ``demo``, ``dashboard``: the ``framefleet`` command line.

Nothing here imports torch, av, boto3 or ``worker``: a producer installs the base package only.
See ARCHITECTURE.md for how the parts fit together.
"""

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
