"""``/healthz``, ``/readyz`` and ``/metrics``: the routes that answer without a key.

``/readyz`` is ready when Redis answers and the output bucket can be listed; one check answers
for ``READY_TTL_S``, so no rate of probes costs more than that. ``/metrics``
(Prometheus text) answers loopback peers only, like every framefleet ``/metrics`` by default;
to anyone else it does not exist. Series: requests by route template, method and status, and
their latency. Every label value comes from a fixed set: the route is the matched template
(or ``unmatched``), the method one of ``METHODS`` or ``other``, the status the one sent. A
client-chosen method must never become a label: 2,000 requests with random 4 KB methods had
grown ``/metrics`` to 16 MB before, and the gateway's memory with it.
"""

from __future__ import annotations

import ipaddress
import time
from typing import Any

import anyio
from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.concurrency import run_in_threadpool
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from producer.api.errors import not_found
from producer.api.store import parse

router = APIRouter(include_in_schema=False)
#: The methods counted by name; any other is counted as ``other``.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def method_label(method: str) -> str:
    return method if method in METHODS else "other"


class Metrics:
    """The gateway's series, in a registry of its own (one per app)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("framefleet_api_requests", "HTTP requests answered",
                                ["route", "method", "status"], registry=self.registry)
        self.latency = Histogram("framefleet_api_request_seconds", "time to the response",
                                 ["route"], registry=self.registry,
                                 buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10))


class _Count:
    """Pure ASGI (Starlette's BaseHTTPMiddleware would wrap errors raised while a handler
    reads the body, such as the body limit's, in task groups)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.requests.labels(route, method_label(scope["method"]), str(status)).inc()
            self.metrics.latency.labels(route).observe(time.perf_counter() - start)


def install_metrics(app: FastAPI) -> None:
    app.state.metrics = Metrics()
    app.state.readiness = Readiness()
    app.add_middleware(_Count, metrics=app.state.metrics)


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


#: How long one readiness check answers for: probes and floods alike cost a replica at most
#: one Redis ping and one S3 list per this many seconds.
READY_TTL_S = 1.0


class Readiness:
    """The last readiness check of this process, and when it ran."""

    def __init__(self) -> None:
        self.checked_at = -READY_TTL_S
        self.problem: str | None = None
        self.lock: anyio.Lock | None = None

    async def problem_now(self, gw: Any) -> str | None:
        """Why this replica is not ready (None: it is), checked again once it is stale."""
        self.lock = self.lock or anyio.Lock()
        async with self.lock:
            if time.monotonic() - self.checked_at >= READY_TTL_S:
                self.problem = await run_in_threadpool(_check, gw)
                self.checked_at = time.monotonic()
            return self.problem


def _check(gw: Any) -> str | None:
    try:
        gw.redis.ping()
    except Exception as e:  # noqa: BLE001 - any failure means not ready, and says why
        return f"redis: {type(e).__name__}"
    try:
        gw.store.ping(parse(gw.output_prefix + "/"))
    except Exception as e:  # noqa: BLE001
        return f"store: {getattr(e, 'code', type(e).__name__)}"
    return None


@router.get("/readyz")
async def readyz(request: Request) -> Response:
    problem = await request.app.state.readiness.problem_now(request.app.state.gateway)
    if problem:
        return Response(f'{{"status":"not ready","reason":"{problem}"}}', 503,
                        media_type="application/json")
    return Response('{"status":"ready"}', media_type="application/json")


@router.get("/metrics")
def metrics(request: Request) -> Response:
    host = request.client.host if request.client else ""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise not_found("route")
    return Response(generate_latest(request.app.state.metrics.registry),
                    media_type=CONTENT_TYPE_LATEST)
