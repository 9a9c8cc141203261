"""What the broker keeps across a restart: Redis persistence, as workers and the doctor see it.

Redis is the queue. With neither an append-only file nor RDB snapshots, a restart loses every
queued job and its clients wait on PENDING for ever; with snapshots only, it loses the jobs
queued since the last snapshot. Managed Redis (ElastiCache, Memorystore) often refuses CONFIG:
then only ``INFO persistence`` is read, and anything but an AOF is reported as unknown.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

import redis

log = logging.getLogger(__name__)

Level = Literal["aof", "rdb", "none", "unknown"]
#: The value of the ``framefleet_broker_persistent`` gauge per level.
GAUGE = {"aof": 1.0, "rdb": 0.5, "none": 0.0, "unknown": -1.0}


@dataclass(frozen=True)
class Persistence:
    level: Level
    detail: str

    @property
    def safe(self) -> bool:
        """Whether a restart keeps every acknowledged write (an fsynced append-only file)."""
        return self.level == "aof"


def broker_persistence(client: Any) -> Persistence:
    """Read a Redis server's persistence; raises only if the server cannot be reached."""
    try:
        aof = str(_first(client.config_get("appendonly"), "appendonly")).lower()
        save = str(_first(client.config_get("save"), "save")).strip()
    except redis.ResponseError:  # CONFIG disabled or renamed, as on managed Redis
        try:
            info = client.info("persistence")
        except redis.ResponseError as e:
            return Persistence("unknown", f"CONFIG and INFO refused ({e})")
        if int(info.get("aof_enabled", 0) or 0) == 1:
            return Persistence("aof", "append-only file on (INFO persistence; CONFIG refused)")
        return Persistence("unknown", "CONFIG refused (managed Redis?); INFO shows no "
                           "append-only file: check the service's own backups and replicas")
    if aof == "yes":
        return Persistence("aof", "append-only file on")
    if save:
        return Persistence("rdb", f"RDB snapshots only (save {save!r}): jobs queued since "
                           "the last snapshot are lost when Redis restarts")
    return Persistence("none", "neither append-only file nor snapshots: a restart of Redis "
                       "loses every queued job")


def _first(reply: Any, key: str) -> Any:
    if isinstance(reply, dict):
        for k, v in reply.items():
            if (k.decode() if isinstance(k, bytes) else k) == key:
                return v.decode() if isinstance(v, bytes) else v
    return ""


REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def server_identity(client: Any) -> tuple[Any, ...]:
    kw = client.connection_pool.connection_kwargs
    return (client.connection_pool.connection_class.__name__, kw.get("host"), kw.get("port"),
            kw.get("path"), kw.get("username"), kw.get("password"))


def same_server(broker_url: str, backend_url: str) -> bool:
    """Whether both URLs name one Redis server (their databases may differ)."""
    if not (broker_url.startswith(REDIS_SCHEMES) and backend_url.startswith(REDIS_SCHEMES)):
        return False
    a, b = redis.Redis.from_url(broker_url), redis.Redis.from_url(backend_url)
    try:
        return server_identity(a) == server_identity(b)
    finally:
        a.close()
        b.close()


def check_broker_url(url: str, timeout_s: float = 5.0) -> Persistence | None:
    """Persistence of the Redis at ``url`` (None: not a Redis URL, e.g. the embedded mode)."""
    if not url.startswith(REDIS_SCHEMES):
        return None
    client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    try:
        return broker_persistence(client)
    finally:
        client.close()
