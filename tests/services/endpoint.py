"""A Redis primary, its replica and one address that follows the primary: the failover of a
managed Redis such as ElastiCache Multi-AZ, whose primary endpoint (a DNS name) is moved to the
promoted replica, on loopback.

The address is a small TCP proxy (``TcpProxy``: threads, one pair per connection) that
forwards to one upstream port at a time. A watcher plays the managed service: it pings the
primary, and once the primary has not answered for ``down_after_s`` it waits ``switch_after_s``
more (the service's own failover time), promotes the replica (``REPLICAOF NO ONE``) and points
the proxy at it. Until then a new connection to the address is closed at once (the dead
primary refuses it), and every connection open through it ends when the primary dies, as a
client of the real service sees it. The fleet is given only ``redis://127.0.0.1:<proxy>/db``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.services.base import ServiceError
from tests.services.sentinel import PrimaryServer, ReplicaServer, wait_replica_synced


class TcpProxy:
    """Forwards every connection to 127.0.0.1:``upstream``; ``switch`` moves it elsewhere and
    closes what is open (a client reconnects, to the new upstream)."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=256)
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._closed = False
        self.forwarded = 0
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                upstream = self.upstream
            try:
                server = socket.create_connection(("127.0.0.1", upstream), timeout=1)
            except OSError:
                client.close()  # nothing listens there: the client sees its connection end
                continue
            server.settimeout(None)
            with self._lock:
                if self._closed or upstream != self.upstream:
                    client.close()
                    server.close()
                    continue
                self._open |= {client, server}
                self.forwarded += 1
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self._drop(src, dst)

    def _drop(self, *socks: socket.socket) -> None:
        with self._lock:
            self._open -= set(socks)
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def switch(self, upstream: int) -> None:
        """Forward new connections to ``upstream``; end every connection open now."""
        with self._lock:
            self.upstream = upstream
            open_now = list(self._open)
        self._drop(*open_now)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            open_now = list(self._open)
        self._listener.close()
        self._drop(*open_now)


class SwitchingEndpoint:
    """Primary, replica, the proxy in front and the watcher that fails over; ``url`` is the
    fleet's URL (the proxy's address)."""

    def __init__(self, binary: str, workdir: Path, down_after_s: float = 1.0,
                 switch_after_s: float = 1.0) -> None:
        self.primary = PrimaryServer(binary, workdir / "primary")
        self.replica = ReplicaServer(binary, workdir / "replica", self.primary.port)
        self.down_after_s, self.switch_after_s = down_after_s, switch_after_s
        self.proxy: TcpProxy | None = None
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self.switched = threading.Event()

    def url(self, db: int = 0) -> str:
        assert self.proxy is not None, "start() first"
        return f"redis://127.0.0.1:{self.proxy.port}/{db}"

    def env(self) -> dict[str, str]:
        """What a worker needs besides the URLs: nothing (one address, no Sentinel)."""
        return {}

    def start(self, timeout: float = 20.0) -> None:
        self.primary.start(timeout)
        self.replica.start(timeout)
        wait_replica_synced(self.replica.port, timeout)
        self.proxy = TcpProxy(self.primary.port)
        self._watcher = threading.Thread(target=self._watch, name="failover-watcher",
                                         daemon=True)
        self._watcher.start()

    def _answers(self) -> bool:
        # One try: redis-py's default retries a refused connection for seconds.
        client = redis.Redis(host="127.0.0.1", port=self.primary.port, socket_timeout=0.5,
                             socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def _watch(self) -> None:
        silent_since: float | None = None
        while not self._stop.wait(0.1):
            if self._answers():
                silent_since = None
                continue
            silent_since = silent_since or time.monotonic()
            if time.monotonic() - silent_since < self.down_after_s:
                continue
            if self._stop.wait(self.switch_after_s):
                return
            promoted = redis.Redis(host="127.0.0.1", port=self.replica.port, socket_timeout=2)
            try:
                promoted.replicaof("NO", "ONE")
            finally:
                promoted.close()
            assert self.proxy is not None
            self.proxy.switch(self.replica.port)
            self.switched.set()
            return

    def wait_promoted(self, timeout: float) -> float:
        """Wait until the address leads to the promoted replica; the seconds waited."""
        start = time.monotonic()
        if not self.switched.wait(timeout):
            raise ServiceError(f"no switch to port {self.replica.port} within {timeout} s")
        return time.monotonic() - start

    def stop(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(10)
        if self.proxy is not None:
            self.proxy.close()
        for process in (self.replica, self.primary):
            process.stop()
