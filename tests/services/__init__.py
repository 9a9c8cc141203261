"""Throwaway real servers for tests: redis-server (alone, or a primary with a replica and
Sentinels, or behind one address that moves to the promoted replica), SeaweedFS (S3) and Celery
workers.

Every server listens on loopback only, on ports picked at run time, with its files in a folder
the caller owns (a pytest temp folder). Each one runs in its own session (process group) so a
stop signals every process it forked, and dies with the test process if that is killed hard
(Linux parent-death signal), so a crashed test run leaves no server behind.

All waits are bounded: a server that does not come up raises ``ServiceError`` with the tail of
its log instead of hanging the suite. Nothing here imports pytest; the fixtures in
``conftest.py`` decide whether a missing binary skips or fails.
"""

from tests.services.base import (
    LOG_TAIL_CHARS,
    REPO_ROOT,
    ServiceError,
    _Process,
    free_port,
    free_port_pair,
    free_ports,
)
from tests.services.celery_worker import WorkerFactory, WorkerProcess
from tests.services.endpoint import SwitchingEndpoint, TcpProxy
from tests.services.redis_server import REDIS_INSTALL, RedisServer, durable_redis
from tests.services.s3_server import WEED_INSTALL, S3Server
from tests.services.sentinel import MASTER_NAME, SentinelGroup

__all__ = [
    "LOG_TAIL_CHARS",
    "MASTER_NAME",
    "REDIS_INSTALL",
    "REPO_ROOT",
    "WEED_INSTALL",
    "RedisServer",
    "S3Server",
    "SentinelGroup",
    "ServiceError",
    "SwitchingEndpoint",
    "TcpProxy",
    "WorkerFactory",
    "WorkerProcess",
    "_Process",
    "durable_redis",
    "free_port",
    "free_port_pair",
    "free_ports",
]
