"""The fleet's Redis as everything outside Celery reaches it, and what it keeps across a restart.

``redis_client(url)`` is the one way to open a Redis client on a fleet URL: ``redis://`` and
``rediss://`` name one server; ``sentinel://h1:26379;sentinel://h2:26379`` names the
Sentinels, and the client asks them for the current primary of ``FRAMEFLEET_SENTINEL_MASTER``
on every new connection, so after a failover the job registry, leases, the host-loss sweep,
the exporter and the gateway write to the promoted replica, as Celery's own connections do.

Persistence:

Redis is the queue. With neither an append-only file nor RDB snapshots, a restart loses every
queued job and its clients wait on PENDING for ever; with snapshots only, it loses the jobs
queued since the last snapshot. Managed Redis (ElastiCache, Memorystore) often refuses CONFIG:
then only ``INFO persistence`` is read, and anything but an AOF is reported as unknown.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import unquote, urlsplit

import redis
from redis.sentinel import Sentinel

from producer.settings.urls import SENTINEL_SEPARATOR

if TYPE_CHECKING:
    from producer.settings import Settings

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


REDIS_SCHEMES = ("redis://", "rediss://", "unix://", "sentinel://")
#: Seconds to wait for a Sentinel's answer: a Sentinel that hangs must not hang the fleet
#: (redis-py's default is the data connection's timeout, often none).
SENTINEL_TIMEOUT_S = 2.0


def sentinel_options(settings: Settings) -> dict[str, Any]:
    """kombu's and Celery's transport options for ``sentinel://`` URLs (``master_name``,
    ``sentinel_kwargs``): the same for the broker and the result backend."""
    kwargs: dict[str, Any] = {"socket_timeout": SENTINEL_TIMEOUT_S,
                              "socket_connect_timeout": SENTINEL_TIMEOUT_S}
    if settings.sentinel_password is not None:
        kwargs["password"] = settings.sentinel_password.get_secret_value()
    return {"master_name": settings.sentinel_master, "sentinel_kwargs": kwargs}


def sentinel_hosts(url: str) -> list[tuple[str, int]]:
    """The (host, port) of every Sentinel a ``sentinel://`` URL lists."""
    return [(urlsplit(p).hostname or "", urlsplit(p).port or 26379)
            for p in url.split(SENTINEL_SEPARATOR)]


def redis_client(url: str, settings: Settings | None = None, **kwargs: Any) -> redis.Redis:
    """A Redis client for a fleet URL; ``kwargs`` go to every connection (timeouts).

    For ``sentinel://`` URLs (database, user and password from the first part, as Celery
    reads them) the client is ``Sentinel(...).master_for(FRAMEFLEET_SENTINEL_MASTER)``: each
    new connection asks the Sentinels where the primary is now, and a connection to a server
    that was demoted to a replica is dropped at its first write (READONLY).
    """
    if not url.startswith("sentinel://"):
        return redis.Redis.from_url(url, **kwargs)
    if settings is None:
        from producer.settings import get_settings

        settings = get_settings()
    options = sentinel_options(settings)
    first = urlsplit(url.split(SENTINEL_SEPARATOR)[0])
    auth = {k: unquote(v) for k, v in (("username", first.username),
                                       ("password", first.password)) if v}
    db = int(first.path.strip("/") or 0)
    sentinel = Sentinel(sentinel_hosts(url), sentinel_kwargs=options["sentinel_kwargs"])
    connect: dict[str, Any] = {"db": db, **auth, **kwargs}  # typed loosely: redis 8.2's stubs
    return sentinel.master_for(options["master_name"], **connect)


def server_identity(client: Any) -> tuple[Any, ...]:
    pool = client.connection_pool
    kw = pool.connection_kwargs
    if hasattr(pool, "service_name"):  # a Sentinel-managed primary: its name and Sentinels
        sentinels = sorted(
            tuple(s.connection_pool.connection_kwargs.get(k) for k in ("host", "port"))
            for s in pool.sentinel_manager.sentinels)
        return ("sentinel", pool.service_name, tuple(sentinels), kw.get("username"),
                kw.get("password"))
    return (pool.connection_class.__name__, kw.get("host"), kw.get("port"),
            kw.get("path"), kw.get("username"), kw.get("password"))


def same_server(broker_url: str, backend_url: str, settings: Settings | None = None) -> bool:
    """Whether both URLs name one Redis server (their databases may differ); two
    ``sentinel://`` URLs do when they list the same Sentinels (and the one primary name)."""
    if not (broker_url.startswith(REDIS_SCHEMES) and backend_url.startswith(REDIS_SCHEMES)):
        return False
    a, b = redis_client(broker_url, settings), redis_client(backend_url, settings)
    try:
        return server_identity(a) == server_identity(b)
    finally:
        a.close()
        b.close()


def check_broker_url(url: str, timeout_s: float = 5.0,
                     settings: Settings | None = None) -> Persistence | None:
    """Persistence of the Redis at ``url`` (None: not a Redis URL, e.g. the embedded mode)."""
    if not url.startswith(REDIS_SCHEMES):
        return None
    client = redis_client(url, settings, socket_timeout=timeout_s,
                          socket_connect_timeout=timeout_s)
    try:
        return broker_persistence(client)
    finally:
        client.close()


def auth_problem(url: str, settings: Settings | None = None,
                 timeout_s: float = 5.0) -> str | None:
    """Why the Redis (or Sentinel) at ``url`` refuses us, or None: it accepts our password,
    it is not a Redis URL, or it does not answer (a server that is down may come back; a
    refused password never does). One PING, with AUTH when the URL has a password."""
    if not url.startswith(REDIS_SCHEMES):
        return None
    client = redis_client(url, settings, socket_timeout=timeout_s,
                          socket_connect_timeout=timeout_s)
    try:
        client.ping()
    except (redis.AuthenticationError, redis.ResponseError) as e:
        if isinstance(e, redis.ResponseError) and not str(e).startswith(("NOAUTH", "WRONGPASS")):
            return None
        if urlsplit(url.split(SENTINEL_SEPARATOR)[0]).password:
            return f"the password was refused ({e})"
        return "the server requires a password and the URL has none"
    except redis.RedisError:
        return None
    finally:
        client.close()
    return None

