"""framefleet's light side: what a producer, an operator and both ends of the wire share.

- ``wire``: the wire format, frozen pydantic models sent as JSON (``wire.spec``: ``JobSpec``
  in, ``Progress`` and ``JobResult`` back, ``Manifest`` next to the output; ``wire.rules``: the
  fleet's rules for a spec). ``producer.spec`` re-exports ``wire.spec`` under its public name.
- ``settings``: every ``FRAMEFLEET_*`` variable, documented and range-checked; read nowhere else.
- ``errors``: the one error tree (``RetryableError`` / ``FatalJobError`` under
  ``FramefleetError``).
- ``app``: the Celery app factory, where the fleet's delivery semantics are configured.
- ``state``: the Redis keys and scripts, broker connections, the job registry and its flags,
  the durable ledger, readiness files.
- ``webhooks``: which URLs a job may notify (``webhooks.hosts``) and how deliveries are signed.
- ``client``: submit, follow, cancel; ``cli``: the ``framefleet`` command line; ``cost``: the
  price catalog, per-job and fleet cost-to-serve; ``ops``, ``api``: the fleet's operations
  tools and HTTP gateway (their own extras).

Nothing here imports torch, av, boto3 or ``worker``: a producer installs the base package only.
See ARCHITECTURE.md for how the parts fit together.
"""

from producer.errors import FatalJobError, FramefleetError, JobCancelled, RetryableError
from producer.wire.spec import JobResult, JobSpec

__all__ = [
    "FatalJobError",
    "FramefleetError",
    "JobCancelled",
    "JobResult",
    "JobSpec",
    "RetryableError",
]
