"""A throwaway Redis primary, its replica and Sentinels on loopback: a failover to provoke.

``redis-server --sentinel`` runs a Sentinel (``redis-sentinel`` is the same binary under
another name), so only the redis-server package is needed. The Sentinels watch the primary
under ``MASTER_NAME`` and declare it down after ``down_after_ms``; killing the primary
(``primary.kill()``: SIGKILL by PID) then promotes the replica within a few seconds.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import redis

from tests.services.base import ServiceError, _Process, free_port
from tests.services.redis_server import RedisServer

MASTER_NAME = "framefleet-test"


class PrimaryServer(RedisServer):
    """A ``redis-server`` whose replicas sync at once (diskless, no delay), every write fsynced."""

    def __init__(self, binary: str, workdir: Path) -> None:
        super().__init__(binary, workdir, appendonly=True)

    def argv(self) -> list[str]:
        return [*super().argv(), "--repl-diskless-sync", "yes",
                "--repl-diskless-sync-delay", "0"]


class ReplicaServer(RedisServer):
    """A ``redis-server`` replicating ``primary_port`` (every write fsynced, like the primary)."""

    def __init__(self, binary: str, workdir: Path, primary_port: int) -> None:
        super().__init__(binary, workdir, appendonly=True)
        self.primary_port = primary_port

    def argv(self) -> list[str]:
        return [*super().argv(), "--replicaof", "127.0.0.1", str(self.primary_port)]


class SentinelServer(_Process):
    """One ``redis-server --sentinel`` on a loopback port watching the primary."""

    def __init__(self, binary: str, workdir: Path, primary_port: int,
                 down_after_ms: int = 1000, quorum: int = 1) -> None:
        super().__init__("redis-sentinel", workdir / "sentinel.log")
        self.binary, self.workdir = binary, workdir
        self.port = free_port()
        self.primary_port, self.down_after_ms, self.quorum = primary_port, down_after_ms, quorum

    def config(self) -> str:
        name = MASTER_NAME
        return "\n".join([
            f"port {self.port}", "bind 127.0.0.1", "daemonize no", f"dir {self.workdir}",
            f"sentinel monitor {name} 127.0.0.1 {self.primary_port} {self.quorum}",
            f"sentinel down-after-milliseconds {name} {self.down_after_ms}",
            f"sentinel failover-timeout {name} 10000",
            f"sentinel parallel-syncs {name} 1", "",
        ])  # fmt: skip

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1,
                           socket_connect_timeout=1)

    def primary(self) -> tuple[str, int] | None:
        """The address this Sentinel names as the primary now, or None (no answer)."""
        client = self.client()
        try:
            found = client.sentinel_get_master_addr_by_name(MASTER_NAME)
        except redis.RedisError:
            return None
        finally:
            client.close()
        return (str(found[0]), int(found[1])) if found else None

    def start(self, timeout: float = 15.0) -> float:
        self.workdir.mkdir(parents=True, exist_ok=True)
        conf = self.workdir / "sentinel.conf"  # Sentinel rewrites its file: one per process
        conf.write_text(self.config())
        self._spawn([self.binary, str(conf), "--sentinel"], os.environ, self.workdir)
        return self._wait_until(lambda: self.primary() is not None, timeout, "primary address")


def wait_replica_synced(port: int, timeout: float) -> None:
    """Wait until the replica on ``port`` has its link to the primary up (first sync done)."""
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                if client.info("replication").get("master_link_status") == "up":
                    return
            except redis.RedisError:
                pass
            time.sleep(0.05)
    finally:
        client.close()
    raise ServiceError(f"replica on port {port} did not sync in {timeout} s")


class SentinelGroup:
    """A primary, one replica and ``sentinels`` Sentinels; ``url`` is the fleet's URL."""

    def __init__(self, binary: str, workdir: Path, sentinels: int = 1,
                 down_after_ms: int = 1000) -> None:
        self.primary: RedisServer = PrimaryServer(binary, workdir / "primary")
        self.replica = ReplicaServer(binary, workdir / "replica", self.primary.port)
        quorum = sentinels // 2 + 1
        self.sentinels = [SentinelServer(binary, workdir / f"sentinel{i}", self.primary.port,
                                         down_after_ms, quorum) for i in range(sentinels)]

    def url(self, db: int = 0) -> str:
        """``sentinel://127.0.0.1:P1/db;sentinel://127.0.0.1:P2/db``."""
        return ";".join(f"sentinel://127.0.0.1:{s.port}/{db}" for s in self.sentinels)

    def start(self, timeout: float = 20.0) -> None:
        self.primary.start(timeout)
        self.replica.start(timeout)
        self.wait_synced(timeout)
        for s in self.sentinels:
            s.start(timeout)

    def wait_synced(self, timeout: float) -> None:
        """Wait until the replica's link to the primary is up (its first sync done)."""
        wait_replica_synced(self.replica.port, timeout)

    def env(self) -> dict[str, str]:
        """What a worker needs besides the URLs: the name the Sentinels know the primary by."""
        return {"FRAMEFLEET_SENTINEL_MASTER": MASTER_NAME}

    def primary_port(self) -> int | None:
        """The port every Sentinel that answers names as the primary (None: they disagree)."""
        found = {s.primary() for s in self.sentinels if s.running}
        found.discard(None)
        return next(iter(found))[1] if len(found) == 1 else None  # type: ignore[index]

    def wait_promoted(self, timeout: float) -> float:
        """Wait until the Sentinels name the replica the primary and it accepts writes."""
        start = time.monotonic()
        client = redis.Redis(host="127.0.0.1", port=self.replica.port, socket_timeout=1)
        try:
            while time.monotonic() - start < timeout:
                try:
                    if (self.primary_port() == self.replica.port
                            and client.info("replication").get("role") == "master"):
                        return time.monotonic() - start
                except redis.RedisError:
                    pass
                time.sleep(0.05)
        finally:
            client.close()
        raise ServiceError(f"no failover to port {self.replica.port} within {timeout} s")

    def stop(self) -> None:
        for process in [*self.sentinels, self.replica, self.primary]:
            process.stop()
