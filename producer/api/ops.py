"""``/healthz``, ``/readyz`` and ``/metrics``: the routes that answer without a key.

``/readyz`` is ready when Redis answers and the output bucket can be listed. ``/metrics``
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
    app.add_middleware(_Count, metrics=app.state.metrics)


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> Response:
    gw = request.app.state.gateway

    def check() -> str | None:
        try:
            gw.redis.ping()
        except Exception as e:  # noqa: BLE001 - any failure means not ready, and says why
            return f"redis: {type(e).__name__}"
        try:
            gw.store.ping(parse(gw.output_prefix + "/"))
        except Exception as e:  # noqa: BLE001
            return f"store: {getattr(e, 'code', type(e).__name__)}"
        return None

    problem = await run_in_threadpool(check)
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
