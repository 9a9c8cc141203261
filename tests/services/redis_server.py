"""A throwaway redis-server on a free loopback port."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from tests.services.base import _Process, free_port

REDIS_INSTALL = "the redis-server package (apt-get install redis-server)"


class RedisServer(_Process):
    """A ``redis-server`` on a loopback port with its files in ``workdir``.

    With ``appendonly=True`` every write is fsynced to the AOF before it is acknowledged, so
    ``kill()`` followed by ``start()`` loses nothing (chaos tests rely on that).
    """

    def __init__(
        self, binary: str, workdir: Path, appendonly: bool = False, port: int | None = None
    ) -> None:
        super().__init__("redis-server", workdir / "redis.log")
        self.binary = binary
        self.workdir = workdir
        self.appendonly = appendonly
        self.port = port or free_port()

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def argv(self) -> list[str]:
        """The command line (also useful in failure messages)."""
        return [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always",
            "--dir", str(self.workdir),
            "--daemonize", "no",
        ]  # fmt: skip

    #: The ``requirepass`` of the server, if it has one (PING needs it then).
    password: str | None = None

    def ping(self) -> bool:
        """True if the server answers PING within a second."""
        client = redis.Redis(host="127.0.0.1", port=self.port, password=self.password,
                             socket_timeout=1, socket_connect_timeout=1)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def start(self, timeout: float = 15.0) -> float:
        """Start and wait until PING answers; return the seconds it took."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._spawn(self.argv(), os.environ, self.workdir)
        return self._wait_until(self.ping, timeout, "PING answer")

    def restart(self, timeout: float = 15.0) -> float:
        """Stop gracefully, start again on the same port and folder (AOF data survives)."""
        self.stop()
        return self.start(timeout)


@contextmanager
def durable_redis(workdir: Path) -> Iterator[RedisServer]:
    """A Redis of one test only, append-only (a kill or restart loses nothing), stopped at the
    end. A fixture built on it and requested before ``worker_factory`` outlives the workers."""
    from tests.require import require_binary

    server = RedisServer(require_binary("redis-server", REDIS_INSTALL), workdir, appendonly=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()


# Environment variables weed reads that would change the server the tests expect:
# weed mini turns AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY into an extra S3 identity and
# S3_BUCKET into pre-created buckets; WEED_* override its TOML configuration.
