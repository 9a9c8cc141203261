"""Fenced writes: what a run writes for its job lands only while the run holds the job's lease.

A run that lost its job's lease (a partition longer than the lease, a host stopped that long)
has been taken for lost: its job was delivered again, and another run may write the same
objects. The holder of the lease (``worker.concerns.lease.JobLease``) is a :class:`Fence`,
and every store write of the run is made inside :func:`fenced` (``JobOutput`` does it for the
job's output, the ledger writer for its record). Such a write is bounded so that it lands
before the lease can have lapsed in Redis, and so before any other run can have taken it:

- it starts only while the lease is known to be held for ``WRITE_MARGIN_S`` more
  (``Fence.check`` waits while the lease cannot be confirmed, and raises ``LeaseLost`` once
  another run took it);
- every HTTP request the S3 client sends from inside ``fenced``, retries and multipart calls
  included, is checked the same way (botocore's ``before-send`` event), and so is every chunk
  of a request's body it reads (:class:`FencedBody`);
- the S3 client's sockets close with a reset (``SO_LINGER`` 0): a request it gave up on is
  dropped by the kernel, never finished when a partition heals; each socket operation times
  out after ``S3_OP_TIMEOUT_S``, unacknowledged data aborts the connection after as long
  (``TCP_USER_TIMEOUT``: a partition), and a small send buffer keeps the bound true on a slow
  link: what is left in it when the body's last chunk was checked drains within one
  operation down to 256 kbit/s. A slower link fails its uploads (retried, then the job fails
  naming the store) rather than land them late.

So the last byte of a write reaches the store within 2 × ``S3_OP_TIMEOUT_S`` of a check that
saw the lease held for ``WRITE_MARGIN_S`` more. A local file (``file://``) lands by a rename,
checked right before. Writes in Redis are fenced in Redis itself (``producer.state.lease_lua``).
"""

from __future__ import annotations

import io
import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

#: Each S3 socket operation (connect, a send, the wait for an answer) gives up after this.
S3_OP_TIMEOUT_S = 3.0
#: A write starts only while the lease holds for this much longer: the two socket operations
#: that may follow the last check, and a second for the network.
WRITE_MARGIN_S = 2 * S3_OP_TIMEOUT_S + 1.0
#: The S3 sockets' send buffer: what the kernel may still send after the last check. Small,
#: so that a slow link drains it within one socket operation (64 KiB, doubled by Linux: 1 s
#: at 1 Mbit/s); large enough for tens of MB/s to an S3 endpoint in the same region (a
#: round trip of 1-2 ms).
S3_SEND_BUFFER = 64 * 1024
#: Socket options of the S3 client: a reset on close (no half-sent request is finished
#: later), the bounded send buffer, and unacknowledged data given up after one operation.
S3_SOCKET_OPTIONS = (
    (socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)),
    (socket.SOL_SOCKET, socket.SO_SNDBUF, S3_SEND_BUFFER),
    (socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(S3_OP_TIMEOUT_S * 1000)),
)


class Fence(Protocol):
    """What a write of a run checks before (and while) it lands."""

    def check(self, what: str) -> None:
        """Return once ``what`` may be written (the lease held for ``WRITE_MARGIN_S`` more);
        wait while that cannot be confirmed; raise ``producer.errors.LeaseLost`` once the run
        lost its lease."""
        ...


_local = threading.local()


@contextmanager
def fenced(fence: Fence | None, what: str) -> Iterator[None]:
    """Check ``fence`` for ``what``, then make it this thread's fence (every S3 request and
    body chunk of the block is checked against it); None: no fence (a write of no run)."""
    before = getattr(_local, "fence", None)
    if fence is not None:
        fence.check(what)
    _local.fence = fence
    try:
        yield
    finally:
        _local.fence = before


def check_current(what: str) -> None:
    """Check this thread's fence (inside ``fenced``) for ``what``; nothing outside one."""
    fence: Fence | None = getattr(_local, "fence", None)
    if fence is not None:
        fence.check(what)


def before_send(request: Any = None, **_: Any) -> None:
    """botocore's ``before-send`` handler: every request of a fenced write is checked."""
    method = getattr(request, "method", "?")
    if method in ("GET", "HEAD"):
        return  # reads change nothing
    check_current(f"S3 {method} {getattr(request, 'url', '?')}")


def harden(client: Any) -> Any:
    """Fence ``client`` (a boto3 S3 client): the ``before-send`` check, and the socket options
    above for every connection it opens from now on. Returns it.

    botocore takes no socket options from its ``Config`` (only keep-alive): they are added to
    the list its HTTP session gives every connection pool (``tests/worker/stores/test_fence.py``
    checks a real connection carries them, so a botocore that stops doing so fails there)."""
    client.meta.events.register("before-send.s3", before_send)
    session = getattr(getattr(client, "_endpoint", None), "http_session", None)
    options = getattr(session, "_socket_options", None)
    if isinstance(options, list):
        options.extend(o for o in S3_SOCKET_OPTIONS if o not in options)
    return client


class FencedBody(io.RawIOBase):
    """A request body read through this thread's fence, chunk by chunk: a write whose run
    loses its lease mid-upload stops sending (and its connection is reset)."""

    def __init__(self, raw: io.BufferedIOBase | io.BytesIO, what: str) -> None:
        self.raw, self.what = raw, what

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self.raw.seek(offset, whence)

    def tell(self) -> int:
        return self.raw.tell()

    def readinto(self, buffer: Any) -> int:
        check_current(self.what)
        data = self.raw.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def read(self, size: int = -1) -> bytes:
        check_current(self.what)
        return self.raw.read(size)

    def close(self) -> None:
        self.raw.close()
        super().close()
