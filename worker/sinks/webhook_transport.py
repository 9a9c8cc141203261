"""One webhook POST: to an address checked against the allow-list, within one deadline.

Each attempt resolves the host, refuses it unless every address passes the allow-list
(``producer/webhooks/rules.py``, with the networks of the entries that allow this URL's port and
path), and connects to a checked address itself (``http.client`` with the socket opened here;
TLS still verifies the host name), so DNS cannot answer differently between the check and the
connection. No proxy environment variables are honoured.

**The deadline is the whole attempt**: connect, TLS handshake, sending, and every read of the
answer, over all the addresses tried, within ``FRAMEFLEET_WEBHOOK_TIMEOUT_S``. A socket timeout
alone bounds each read, and a receiver that sends one byte every second would hold the thread
for as long as it likes; so a watchdog timer shuts the socket down at the deadline, which
wakes the blocked read at once.
"""

from __future__ import annotations

import contextlib
import email.utils
import http.client
import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Callable

from producer.webhooks.rules import Address, Target

USER_AGENT = "framefleet-webhooks/1"
#: Bytes of an answer's body read (and dropped): the answer is not ours to keep.
MAX_ANSWER_BYTES = 64 * 1024
#: Resolves (host, port) to the addresses to try, in order (a parameter for tests).
Resolver = Callable[[str, int], list[Address]]


def resolve(host: str, port: int) -> list[Address]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [ipaddress.ip_address(info[4][0]) for info in infos]


class DeadlineExceeded(OSError):
    """The attempt's deadline passed; the watchdog cut the connection."""


class _Deadline:
    """A monotonic deadline and the watchdog that enforces it on one socket at a time."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds
        self.expired = False
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def left(self) -> float:
        left = self.at - time.monotonic()
        if left <= 0 or self.expired:
            raise DeadlineExceeded(f"no answer within the {self.seconds:g} s deadline")
        return left

    def watch(self, sock: socket.socket) -> socket.socket:
        with self._lock:
            self._sock = sock
            if self.expired:
                self._shutdown(sock)
        return sock

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            if self._sock is not None:
                self._shutdown(self._sock)

    @staticmethod
    def _shutdown(sock: socket.socket) -> None:
        # shutdown (not close) wakes a read blocked in another thread; the owner closes.
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)

    def cancel(self) -> None:
        self._timer.cancel()


class _PinnedHTTP(http.client.HTTPConnection):
    """HTTP to a checked address; Host header and URL keep the name."""

    def __init__(self, host: str, port: int, address: Address, deadline: _Deadline) -> None:
        super().__init__(host, port, timeout=deadline.left())
        self.address = address
        self.deadline = deadline

    def _open(self) -> socket.socket:
        sock = socket.create_connection((str(self.address), self.port), self.deadline.left())
        return self.deadline.watch(sock)

    def connect(self) -> None:
        self.sock = self._open()


class _PinnedHTTPS(_PinnedHTTP):
    """HTTPS to a checked address; the certificate is verified against the host name."""

    default_port = http.client.HTTPS_PORT

    def __init__(self, host: str, port: int, address: Address, deadline: _Deadline) -> None:
        super().__init__(host, port, address, deadline)
        self.tls = ssl.create_default_context()

    def connect(self) -> None:
        raw = self._open()
        raw.settimeout(self.deadline.left())
        self.sock = self.deadline.watch(self.tls.wrap_socket(raw, server_hostname=self.host))


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` header value asks for: delta-seconds or an HTTP date
    (RFC 9110 10.2.3); None when absent or unreadable (the back-off applies alone)."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # not an HTTP date (those are GMT)
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def post(target: Target, addresses: list[Address], headers: dict[str, str], body: bytes,
         deadline_s: float) -> tuple[int, float | None]:
    """POST ``body`` to the first of ``addresses`` that answers, all within ``deadline_s``:
    (HTTP status, the Retry-After seconds it asked for). Raises ``OSError`` (the deadline's
    included) or ``http.client.HTTPException`` when none answered."""
    deadline = _Deadline(deadline_s)
    kind = _PinnedHTTPS if target.scheme == "https" else _PinnedHTTP
    last: Exception = OSError(f"{target.host}: no address")
    headers = {"User-Agent": USER_AGENT, **headers}
    try:
        for addr in addresses:  # the first address that accepts a connection gets it
            try:
                conn = kind(target.host, target.port, addr, deadline)
            except DeadlineExceeded as e:
                last = e
                break
            try:
                conn.request("POST", target.path, body=body, headers=headers)
                response = conn.getresponse()
                response.read(MAX_ANSWER_BYTES)
                if deadline.expired:  # the answer may have been cut short; it is late anyway
                    raise DeadlineExceeded(f"no answer within the {deadline_s:g} s deadline")
                return response.status, retry_after_s(response.getheader("Retry-After"))
            except (OSError, http.client.HTTPException) as e:
                last = DeadlineExceeded(str(e)) if deadline.expired else e
                if deadline.expired:
                    break
            finally:
                conn.close()
    finally:
        deadline.cancel()
    if isinstance(last, DeadlineExceeded):
        raise DeadlineExceeded(f"no answer within the {deadline_s:g} s deadline")
    raise last
