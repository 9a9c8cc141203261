"""The worker's registry and its /metrics server.

Worker series live in :data:`WORKER_REGISTRY` (served by :func:`start_metrics_server` in the
process that runs tasks: with Celery's prefork pool that is the pool child, so start it from
``worker_process_init``, where CUDA is initialised too). The fleet's queue depth is not a
worker's to report: :mod:`producer.ops.exporter` serves it, one per fleet.
"""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)

from producer.ops.exporter import EXPORTER_REGISTRY
from producer.settings import get_settings

WORKER_REGISTRY = CollectorRegistry()
ProcessCollector(registry=WORKER_REGISTRY)
PlatformCollector(registry=WORKER_REGISTRY)

_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gauge": ("",),
}

_server_lock = threading.Lock()
_server: WSGIServer | None = None


def metric_names() -> frozenset[str]:
    """Every ``framefleet_*`` series name framefleet exposes, suffixes included: a worker's
    and the fleet exporter's (dashboards and alert rules use both). The package imports every
    family before anyone can call this, so each family's series are registered."""
    names: set[str] = set()
    for registry in (WORKER_REGISTRY, EXPORTER_REGISTRY):
        for family in registry.collect():
            if family.name.startswith("framefleet_"):
                names.update(family.name + s for s in _SUFFIXES.get(family.type, ("",)))
    return frozenset(names)


def start_metrics_server(port: int, addr: str | None = None) -> int:
    """Serve the worker's /metrics on ``addr:port``; 0 means off. Returns the port (0: off).

    ``addr`` defaults to FRAMEFLEET_METRICS_ADDR (loopback unless configured: the series are
    unauthenticated; the container images set 0.0.0.0 for Prometheus to scrape them).

    Idempotent within a process: a second call returns the port already served.
    """
    global _server
    if port == 0:
        return 0
    with _server_lock:
        if _server is None:
            addr = addr or str(get_settings().metrics_addr)
            _server, _thread = start_http_server(port, addr=addr, registry=WORKER_REGISTRY)
        return int(_server.server_port)


def stop_metrics_server() -> None:
    """Stop the server of :func:`start_metrics_server` (tests, clean shutdown)."""
    global _server
    with _server_lock:
        if _server is not None:
            _server.shutdown()
            _server.server_close()
            _server = None


def server() -> WSGIServer | None:
    """The server :func:`start_metrics_server` started, or None."""
    return _server
