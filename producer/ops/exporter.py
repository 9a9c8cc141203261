"""The fleet exporter: Celery queue depth on a Redis broker, for Prometheus and CloudWatch.

One per fleet (``framefleet exporter``), never one per worker: N workers would report the same
backlog N times. Its series live in :data:`EXPORTER_REGISTRY`, apart from a worker's:

- ``framefleet_queue_depth{queue}``: messages waiting, all priority steps summed;
- ``framefleet_queue_oldest_age_seconds{queue}``: how long the oldest waiting job has waited,
  from the enqueue stamp the client puts in each message's headers (0: the queue is empty);
- ``framefleet_jobs_total{status="failure",reason="InvalidJobError",tenant="unknown"}``: the
  messages no worker could decode (not JSON, pickle). A worker's consumer counts them in the
  broker's Redis (:func:`count_undecodable`): it runs in the worker's main process, which
  serves no metrics, and such a job never reaches the task that would count it.
- ``framefleet_jobs_resent_total``: jobs whose message was lost (a Redis failover) and that a
  worker's lost-message reconciler sent again (``worker.lifecycle.reconcile``), counted in Redis.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import redis
from prometheus_client import CollectorRegistry, Gauge, start_http_server
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from producer.app import ENQUEUED_AT_HEADER
from producer.ops import cloudwatch as cloudwatch_ops
from producer.settings import get_settings
from producer.state import keys
from producer.state.broker import REDIS_SCHEMES, redis_client

log = logging.getLogger(__name__)



EXPORTER_REGISTRY = CollectorRegistry()
QUEUE_DEPTH = Gauge(
    "framefleet_queue_depth",
    "Messages waiting in a Celery queue, all priority steps summed.",
    ["queue"],
    registry=EXPORTER_REGISTRY,
)
QUEUE_OLDEST_AGE = Gauge(
    "framefleet_queue_oldest_age_seconds",
    "Seconds the oldest waiting job of a queue has waited (now minus the enqueue stamp of the"
    " next message of each priority step, the largest); 0 when the queue is empty.",
    ["queue"],
    registry=EXPORTER_REGISTRY,
)


class _Undecodable(Collector):
    """``framefleet_jobs_total`` of the undecodable messages, as last read from Redis."""

    def __init__(self) -> None:
        self.value: float | None = None  # None: not read (yet), so no series

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "framefleet_jobs",
            "Jobs that ended, by outcome; from the exporter: messages no worker could decode.",
            labels=["status", "reason", "tenant"],
        )
        if self.value is not None:
            family.add_metric(["failure", "InvalidJobError", "unknown"], self.value)
        yield family


UNDECODABLE = _Undecodable()
EXPORTER_REGISTRY.register(UNDECODABLE)


class _Resent(Collector):
    """``framefleet_jobs_resent_total``, as last read from Redis."""

    def __init__(self) -> None:
        self.value: float | None = None

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "framefleet_jobs_resent",
            "Jobs sent again because their message was lost (in no queue list, not unacked) "
            "before any worker received them: a Redis failover.")
        if self.value is not None:
            family.add_metric([], self.value)
        yield family


RESENT = _Resent()
EXPORTER_REGISTRY.register(RESENT)


def count_undecodable(broker_url: str | None) -> None:
    """Count one message no worker could decode on the broker at ``broker_url`` (a worker's
    consumer calls this; a broker that is not Redis, as in embedded mode, counts nothing)."""
    if not broker_url or not broker_url.startswith(REDIS_SCHEMES):
        return
    try:
        client = redis_client(broker_url, socket_timeout=5, socket_connect_timeout=5)
        try:
            client.incr(keys.UNDECODABLE)
        finally:
            client.close()
    except (redis.RedisError, ValueError) as e:
        log.warning("undecodable message not counted: %s", e)


def _depth(client: redis.Redis, queue: str) -> int:
    pipe = client.pipeline(transaction=False)
    for name in keys.queue_lists(queue):
        pipe.llen(name)
    # A key of another type under one of these names is not ours: skip it, do not fail.
    sizes = pipe.execute(raise_on_error=False)
    return sum(size for size in sizes if isinstance(size, int))


def enqueued_at(raw: bytes | str | None) -> float | None:
    """The enqueue stamp in a raw kombu message (the JSON envelope kombu's Redis transport
    keeps in the list); None when the item is not such a message or has no stamp."""
    if raw is None:
        return None
    try:
        envelope = json.loads(raw)
        value = envelope["headers"][ENQUEUED_AT_HEADER]
    except (ValueError, TypeError, KeyError):
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _oldest_stamp(client: redis.Redis, queue: str) -> float | None:
    """The earliest enqueue stamp among the next message of each priority list.

    kombu pushes on the left and pops on the right (and restores on the right), so the right
    end (index -1) of a list is the message that waited longest at that priority step.
    """
    pipe = client.pipeline(transaction=False)
    for name in keys.queue_lists(queue):
        pipe.lindex(name, -1)
    heads = pipe.execute(raise_on_error=False)
    stamps = [s for s in (enqueued_at(h) for h in heads if isinstance(h, bytes | str)) if s]
    return min(stamps, default=None)


def queue_depth(redis_url: str, queue: str = "video") -> int:
    """Messages waiting in a Celery queue on a Redis broker, all priority steps summed."""
    client = redis_client(redis_url, socket_timeout=5, socket_connect_timeout=5)
    try:
        return _depth(client, queue)
    finally:
        client.close()


def export_once(
    client: redis.Redis, queues: Iterable[str], cloudwatch: Any = None, *,
    now: float | None = None,
) -> None:
    """Set ``framefleet_queue_depth`` and ``framefleet_queue_oldest_age_seconds`` per queue
    (``now``: the clock, for tests), and read the count of undecodable messages; with a
    CloudWatch client, also put the depth there."""
    for queue in queues:
        try:
            depth = _depth(client, queue)
            oldest = _oldest_stamp(client, queue) if depth else None
        except redis.RedisError as e:
            # No stale number: the series disappear while Redis cannot be read.
            log.warning("queue depth of %r unavailable: %s", queue, e)
            for gauge in (QUEUE_DEPTH, QUEUE_OLDEST_AGE):
                with contextlib.suppress(KeyError):
                    gauge.remove(queue)
            continue
        QUEUE_DEPTH.labels(queue=queue).set(depth)
        if not depth:
            QUEUE_OLDEST_AGE.labels(queue=queue).set(0)
        elif oldest is not None:
            age = (time.time() if now is None else now) - oldest
            QUEUE_OLDEST_AGE.labels(queue=queue).set(max(0.0, age))
        else:  # jobs wait, but none at a list's head carries a stamp: the age is unknown
            with contextlib.suppress(KeyError):
                QUEUE_OLDEST_AGE.remove(queue)
        if cloudwatch is not None:
            cloudwatch_ops.put_queue_depth(cloudwatch, queue, depth)
    for collector, key in ((UNDECODABLE, keys.UNDECODABLE), (RESENT, keys.RESENT)):
        try:
            raw = client.get(key)
            collector.value = float(raw) if raw is not None else 0.0
        except (redis.RedisError, ValueError) as e:
            log.warning("%s unavailable: %s", key, e)
            collector.value = None


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
    """Serve the exporter's series on ``addr:port``, refreshed every ``interval_s``.

    With ``cloudwatch`` the depth also goes to CloudWatch (see :mod:`producer.ops.cloudwatch`)
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
    client = redis_client(redis_url, socket_timeout=5, socket_connect_timeout=5)
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

