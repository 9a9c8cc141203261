"""The client library: submit job specs, follow them, fetch their results, cancel them.

- ``client``: ``Client`` (submit, submit_many, get, state, cancel, ping);
- ``bulk``: many jobs at once, each with every guarantee of one submit (``Submitted``);
- ``handle``: ``JobHandle``, one submitted job (state, progress, result, wait);
- ``jobstate``: what a job is doing, UNKNOWN and QUEUED told apart;
- ``connection``: bounded Redis waits and one-line broker errors.

Imports no torch, av, boto3 or ``worker`` code; it only speaks the wire format of
``producer.wire.spec``.
"""

from producer.client.bulk import Submitted
from producer.client.client import RERUNNABLE, Client
from producer.client.handle import UNKNOWN_GRACE_S, JobHandle

__all__ = ["RERUNNABLE", "UNKNOWN_GRACE_S", "Client", "JobHandle", "Submitted"]
