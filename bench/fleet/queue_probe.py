"""Timestamps for ``queue_bench.py``, loaded into a real worker with ``-I bench.fleet.queue_probe``.

Production code is untouched: this module only connects Celery signal handlers that push
``[event, task_id, seconds]`` JSON records onto a Redis list the benchmark reads.

- ``received``: ``task_received``, in the worker's main process, when the consumer got the
  message from the broker.
- ``start``: ``task_prerun``, in the pool child, just before the task body runs.
- ``end``: ``task_postrun``, in the pool child, with the final state.

Times are ``CLOCK_MONOTONIC``: on Linux one clock for every process of the host, so the
benchmark (same host) can subtract its own readings from them, and NTP steps cannot skew a
sample. The clock is read before the Redis push, so the push does not count. Without
``BENCH_QUEUE_PROBE_URL`` the handlers do nothing (a benchmark's hook, so deliberately not a
``FRAMEFLEET_*`` variable: those are the product's settings, all in ``producer/settings``).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery.signals import task_postrun, task_prerun, task_received

#: The Redis list the records go to (in the database of BENCH_QUEUE_PROBE_URL).
EVENTS_KEY = "framefleet:bench:events"
URL_ENV = "BENCH_QUEUE_PROBE_URL"

# One client per process; redis-py drops connections inherited across a fork by itself.
_client: redis.Redis | None = None


def now() -> float:
    """The clock shared with the benchmark process."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def _push(event: str, task_id: str | None, at: float, state: str | None = None) -> None:
    global _client
    url = os.environ.get(URL_ENV)
    if not url or task_id is None:
        return
    if _client is None:
        _client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
    _client.rpush(EVENTS_KEY, json.dumps([event, task_id, at, state]))


@task_received.connect
def _received(request: Any = None, **_: Any) -> None:
    at = now()
    _push("received", getattr(request, "id", None), at)


@task_prerun.connect
def _start(task_id: str | None = None, **_: Any) -> None:
    at = now()
    _push("start", task_id, at)


@task_postrun.connect
def _end(task_id: str | None = None, state: str | None = None, **_: Any) -> None:
    at = now()
    _push("end", task_id, at, state)
