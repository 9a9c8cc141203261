"""Request bodies bounded by settings, answered 413 in the API's one JSON error shape.

Starlette's own limiter answers 413 as plain text, outside the app's error handlers, so the
gateway keeps this small one: a declared ``Content-Length`` over the limit is refused before
anything is read; a body that turns out longer (chunked) stops the read with an
``ApiRequestError``, which the error handlers turn into the JSON 413. Only ``POST /v1/videos``
(it may carry an ``input_reference`` image) and ``POST /v1/files`` (a batch's JSON Lines) get
the upload limit.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from producer.api.errors import respond
from producer.errors import ApiRequestError

UPLOAD_PATHS = ("/v1/videos", "/v1/files")


def _too_large(limit: int) -> ApiRequestError:
    return ApiRequestError(413, "body_too_large", f"the request body is over {limit} bytes")


class BodyLimit:
    def __init__(self, app: ASGIApp, max_body: int, max_upload: int) -> None:
        self.app, self.max_body, self.max_upload = app, max_body, max_upload

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        upload = scope["method"] == "POST" and scope["path"].rstrip("/") in UPLOAD_PATHS
        limit = self.max_upload if upload else self.max_body
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await respond(_too_large(limit))(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _too_large(limit)
            return message

        await self.app(scope, limited, send)
