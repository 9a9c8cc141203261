"""The fleet exporter: Celery queue depth on a Redis broker, for Prometheus and CloudWatch.

One per fleet (``framefleet exporter``), never one per worker: N workers would report the same
backlog N times. Its series live in :data:`EXPORTER_REGISTRY`, apart from a worker's.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import redis
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from producer.settings import get_settings
from worker.ops import cloudwatch as cloudwatch_ops

log = logging.getLogger(__name__)

#: kombu's Redis transport keeps priority step N > 0 of queue Q in the list ``Q\x06\x16N``
#: (``Channel.sep``); ":" is summed too, for transports configured with ``sep=":"``.
KOMBU_SEPARATORS = ("\x06\x16", ":")
PRIORITY_STEPS = range(1, 10)

EXPORTER_REGISTRY = CollectorRegistry()
QUEUE_DEPTH = Gauge(
    "framefleet_queue_depth",
    "Messages waiting in a Celery queue, all priority steps summed.",
    ["queue"],
    registry=EXPORTER_REGISTRY,
)


def queue_names(queue: str) -> list[str]:
    """The Redis lists kombu uses for ``queue``: the plain name, then one per priority step."""
    return [queue] + [f"{queue}{sep}{n}" for sep in KOMBU_SEPARATORS for n in PRIORITY_STEPS]


def _depth(client: redis.Redis, queue: str) -> int:
    pipe = client.pipeline(transaction=False)
    for name in queue_names(queue):
        pipe.llen(name)
    # A key of another type under one of these names is not ours: skip it, do not fail.
    sizes = pipe.execute(raise_on_error=False)
    return sum(size for size in sizes if isinstance(size, int))


def queue_depth(redis_url: str, queue: str = "video") -> int:
    """Messages waiting in a Celery queue on a Redis broker, all priority steps summed."""
    client = redis.Redis.from_url(redis_url, socket_timeout=5, socket_connect_timeout=5)
    try:
        return _depth(client, queue)
    finally:
        client.close()


def export_once(client: redis.Redis, queues: Iterable[str], cloudwatch: Any = None) -> None:
    """Set ``framefleet_queue_depth`` per queue; with a CloudWatch client, also put it there."""
    for queue in queues:
        try:
            depth = _depth(client, queue)
        except redis.RedisError as e:
            # No stale number: the series disappears while Redis cannot be read.
            log.warning("queue depth of %r unavailable: %s", queue, e)
            with contextlib.suppress(KeyError):
                QUEUE_DEPTH.remove(queue)
            continue
        QUEUE_DEPTH.labels(queue=queue).set(depth)
        if cloudwatch is not None:
            cloudwatch_ops.put_queue_depth(cloudwatch, queue, depth)


def run_exporter(
    redis_url: str,
    port: int,
    cloudwatch: bool,
    interval_s: float,
    *,
    queues: Sequence[str] = ("video",),
    addr: str | None = None,
    stop: threading.Event | None = None,
    max_iterations: int | None = None,
    cloudwatch_client: Any = None,
) -> None:
    """Serve ``framefleet_queue_depth`` on ``addr:port``, refreshed every ``interval_s``.

    With ``cloudwatch`` the depth also goes to CloudWatch (see :mod:`worker.ops.cloudwatch`)
    for the autoscaling group; ``cloudwatch_client`` replaces the default
    ``boto3.client("cloudwatch")``. Runs until ``stop`` is set or after ``max_iterations``
    refreshes; the HTTP server is stopped on the way out.
    """
    if interval_s <= 0:
        raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
    stop = stop or threading.Event()
    cw = cloudwatch_client
    if cloudwatch and cw is None:
        cw = cloudwatch_ops.cloudwatch_client()
    client = redis.Redis.from_url(redis_url, socket_timeout=5, socket_connect_timeout=5)
    addr = addr or str(get_settings().metrics_addr)  # loopback unless configured
    server, _thread = start_http_server(port, addr=addr, registry=EXPORTER_REGISTRY)
    log.info("exporter serving queue depth of %s on %s:%d", list(queues), addr, port)
    try:
        done = 0
        while not stop.is_set():
            export_once(client, queues, cw if cloudwatch else None)
            done += 1
            if max_iterations is not None and done >= max_iterations:
                break
            stop.wait(interval_s)
    finally:
        server.shutdown()
        server.server_close()
        client.close()

