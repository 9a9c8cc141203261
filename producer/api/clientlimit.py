"""Requests without a valid key are rate-limited too: per client address, across every
replica (the same ``limits`` windows in Redis as the tenants' own limits), 429 with
``Retry-After`` beyond ``FRAMEFLEET_API_ANON_RATE_PER_MINUTE``.

Without it, anyone could make the gateway serve the page, 401s and 404s as fast as they could
send. A request with a valid key passes to
its tenant's own limit; one with a wrong key counts against its address like one without.
``/healthz`` and ``/readyz`` are exempt: a probe must never be told 429, liveness answers
from memory, and readiness checks Redis and S3 at most once a second per replica however often
it is asked. So is a ``/metrics`` scrape from a loopback peer (the only peers ``/metrics``
answers): after 120 keyless requests from 127.0.0.1 a Prometheus beside the gateway was told
429 for up to a minute. ``/metrics`` asked from elsewhere counts like any request.
The client address is the peer's, or what a trusted proxy says
(``FRAMEFLEET_API_TRUSTED_PROXIES``, applied by uvicorn before this runs).
"""

from __future__ import annotations

import ipaddress

import anyio
from starlette.types import ASGIApp, Receive, Scope, Send

from producer.api.context import Gateway
from producer.api.errors import respond
from producer.errors import ApiRequestError

EXEMPT = frozenset({"/healthz", "/readyz"})


def _scrape(scope: Scope) -> bool:
    """A ``/metrics`` scrape from a loopback peer, the only peers it answers: exempt, so a
    Prometheus beside the gateway is never starved by other keyless clients of its address.
    From anywhere else ``/metrics`` is a 404 that counts like any other."""
    client = scope.get("client")
    if scope["path"] != "/metrics" or not client:
        return False
    try:
        return ipaddress.ip_address(client[0]).is_loopback
    except ValueError:
        return False


class ClientLimit:
    """Pure ASGI: it answers before any route, so unmatched paths and 405s count too."""

    def __init__(self, app: ASGIApp, gateway: Gateway) -> None:
        self.app, self.gateway = app, gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in EXEMPT or _scrape(scope):
            await self.app(scope, receive, send)
            return
        authorization = next((v.decode("latin-1") for k, v in scope.get("headers") or []
                              if k == b"authorization"), None)
        # A key check is a hash and a few compares: no thread needed; the limiter's Redis is.
        if not self.gateway.keyed(authorization):
            client = scope.get("client")
            try:
                await anyio.to_thread.run_sync(self.gateway.admit_unkeyed,
                                               client[0] if client else None)
            except ApiRequestError as e:
                await respond(e)(scope, receive, send)
                return
        await self.app(scope, receive, send)
