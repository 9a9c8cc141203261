"""The methods of a path: ``HEAD`` wherever ``GET`` answers, and 405s that list them all.

RFC 9110 §9.1: a server that answers GET answers HEAD, with the same status and headers and
no body. FastAPI gives a route only the methods it was declared with, so ``HEAD /healthz``
was a 405. :class:`Head` serves a HEAD that no route declares through the path's GET route
and drops the body (the ``Content-Length`` stays the GET's, as §9.3.2 allows). Routes that
read less for a HEAD (a job's files, a video's content) declare HEAD themselves and keep it.
An event stream has no HEAD: its GET never ends while the job runs.

RFC 9110 §15.5.6: a 405's ``Allow`` lists every method the path has. Each method is a route
of its own here, and Starlette's 405 names only the first route that matched the path
(``PUT /v1/videos`` said ``Allow: POST``); :func:`allowed` is the whole list.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from fastapi.sse import EventSourceResponse
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send


def _flat(routes: Sequence[BaseRoute]) -> Iterator[BaseRoute]:
    """The routes one by one: FastAPI keeps an included router as one entry that matches for
    all its routes (``original_router``), and only a route says its methods."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from _flat(inner.routes)
        else:
            yield route


def _get_route(routes: Sequence[BaseRoute], scope: Scope) -> BaseRoute | None:
    """The GET route that would answer ``scope``'s path, when it can answer a HEAD too."""
    as_get = {**scope, "method": "GET"}
    for route in _flat(routes):
        if route.matches(as_get)[0] is Match.FULL:
            streams = getattr(route, "response_class", None) is EventSourceResponse
            return None if streams else route
    return None


def allowed(routes: Sequence[BaseRoute], scope: Scope) -> list[str]:
    """Every method of ``scope``'s path (HEAD wherever GET but on a stream), sorted."""
    methods: set[str] = set()
    for route in _flat(routes):
        if route.matches(scope)[0] is not Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    if "GET" in methods and _get_route(routes, scope) is not None:
        methods.add("HEAD")
    return sorted(methods)


def _declares_head(routes: Sequence[BaseRoute], scope: Scope) -> bool:
    as_head = {**scope, "method": "HEAD"}
    return any(r.matches(as_head)[0] is Match.FULL for r in _flat(routes))


class Head:
    """Pure ASGI: a HEAD that no route declares is served by the path's GET, without body."""

    def __init__(self, app: ASGIApp, routes: Sequence[BaseRoute]) -> None:
        self.app, self.routes = app, routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope["method"] != "HEAD"
                or _declares_head(self.routes, scope)
                or _get_route(self.routes, scope) is None):
            await self.app(scope, receive, send)
            return
        as_get: dict[str, Any] = {**scope, "method": "GET"}
        ended = False

        async def bodiless(message: Message) -> None:
            nonlocal ended
            if message["type"] == "http.response.body":
                if ended or message.get("more_body", False):
                    return
                ended = True
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        try:
            await self.app(as_get, receive, bodiless)
        finally:
            # What the router found (the route, its path parameters) for the outer
            # middleware's metrics; the method stays the client's.
            scope.update({k: v for k, v in as_get.items() if k != "method"})
