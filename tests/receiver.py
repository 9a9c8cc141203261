"""A webhook receiver on loopback for tests: records every request, answers as scripted."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from producer.webhooks.rules import SIGNATURE_HEADER, TIMESTAMP_HEADER, verify


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # monotonic

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    def verifies(self, secret: str) -> bool:
        return verify(secret, self.headers.get(TIMESTAMP_HEADER, ""),
                      self.headers.get(SIGNATURE_HEADER, ""), self.body)


class Receiver:
    """``statuses``: answers to the first requests, in order (then 200); ``delay_s``: how long
    each answer takes; ``location``: the Location header of 3xx answers; ``tls``: serve HTTPS
    with this server context; ``retry_after``: the Retry-After header of 429 and 503 answers;
    ``host``: the address it listens on (loopback; another one in a partition test's
    namespace)."""

    def __init__(self, statuses: tuple[int, ...] = (), delay_s: float = 0.0,
                 location: str = "/elsewhere", tls: ssl.SSLContext | None = None,
                 retry_after: str | None = None, host: str = "127.0.0.1") -> None:
        self.host = host
        self.statuses = list(statuses)
        self.retry_after = retry_after
        self.delay_s = delay_s
        self.location = location
        self.received: list[Received] = []
        self.lock = threading.Lock()
        self.closing = threading.Event()
        self.httpd = ThreadingHTTPServer((host, 0), self._handler())
        self.httpd.daemon_threads = True
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def url(self, path: str = "/hook") -> str:
        return f"http://{self.host}:{self.port}{path}"

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.closing.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def wait(self, count: int, timeout: float) -> list[Received]:
        """The first ``count`` requests, waiting up to ``timeout`` s for them."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.received) >= count:
                    return list(self.received)
            time.sleep(0.02)
        with self.lock:
            raise AssertionError(f"{len(self.received)} of {count} requests in {timeout} s")

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver.lock:
                    receiver.received.append(
                        Received(self.path, dict(self.headers.items()), body, time.monotonic()))
                    status = receiver.statuses.pop(0) if receiver.statuses else 200
                receiver.closing.wait(receiver.delay_s)
                self.send_response(status)
                if 300 <= status < 400:
                    self.send_header("Location", receiver.location)
                if status in (429, 503) and receiver.retry_after is not None:
                    self.send_header("Retry-After", receiver.retry_after)
                self.send_header("Content-Length", "0")
                self.end_headers()

        return Handler


@dataclass
class Trickle:
    """One connection to a :class:`Trickler`: when it came, when the peer closed it (None
    while open), and the answer's bytes sent by then."""

    accepted: float  # monotonic
    closed: float | None = None
    sent: int = 0


class Trickler:
    """A receiver that reads the request, then answers one byte every ``interval_s`` for up
    to ``total_s`` (a status line and headers that never end in time): a read timeout alone
    never fires against it. Each connection's fate is recorded in ``connections``."""

    ANSWER = b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"a" * 200 + b"\r\n\r\n"

    def __init__(self, interval_s: float = 2.0, total_s: float = 45.0) -> None:
        self.interval_s = interval_s
        self.total_s = total_s
        self.connections: list[Trickle] = []
        self.lock = threading.Lock()
        self.closing = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.threads: list[threading.Thread] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def __enter__(self) -> Trickler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.closing.set()
        self.thread.join(5)
        for thread in self.threads:
            thread.join(5)
        self.listener.close()

    def wait(self, count: int, timeout: float) -> list[Trickle]:
        """The first ``count`` connections, waiting up to ``timeout`` s for them."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.connections) >= count:
                    return list(self.connections)
            time.sleep(0.02)
        raise AssertionError(f"{len(self.connections)} of {count} connections in {timeout} s")

    def _accept(self) -> None:
        while not self.closing.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            record = Trickle(time.monotonic())
            with self.lock:
                self.connections.append(record)
            thread = threading.Thread(target=self._trickle, args=(conn, record), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _trickle(self, conn: socket.socket, record: Trickle) -> None:
        with conn:
            conn.settimeout(self.interval_s)
            end = time.monotonic() + self.total_s
            with contextlib.suppress(OSError):
                conn.recv(65536)  # the request (one read is enough: the answer never ends)
                while time.monotonic() < end and not self.closing.is_set():
                    conn.sendall(self.ANSWER[record.sent % len(self.ANSWER):][:1])
                    record.sent += 1
                    try:  # wait one interval, but see at once when the peer goes
                        if conn.recv(65536) == b"":
                            break
                    except TimeoutError:
                        continue
            record.closed = time.monotonic()
