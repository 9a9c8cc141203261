"""Every error the gateway answers, in one JSON shape: OpenAI's, so its SDKs parse it.

``{"error": {"message": ..., "type": ..., "param": <field or null>, "code": ...}}``. The
``openai`` SDK raises ``BadRequestError``, ``AuthenticationError``, ``NotFoundError``,
``RateLimitError`` … from it with ``.code`` and ``.param`` set. Errors of the fleet
(``producer.errors``) map onto statuses here, once.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from producer.api.methods import allowed
from producer.errors import (
    ApiRequestError,
    BrokerError,
    FramefleetError,
    InvalidJobError,
    JobConflictError,
    UnknownJobError,
)

#: OpenAI's error ``type`` per status; any other 4xx is the client's (invalid_request_error),
#: any 5xx the server's (server_error).
TYPES = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error",
         501: "invalid_request_error"}
CODES = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large",
         416: "range_not_satisfiable"}
# "generate.num_frames: must be 4k+1" or "invalid job spec: time_limit_s: ...": the field,
# whatever it is spelt with (a body's own key may be any text: "video.kæï: Extra inputs …");
# of "generate.height, generate.width: …" the first.
_FIELD = re.compile(r"^(?:invalid job spec: )?([^\s:][^:]*?): ")


#: The body of every error, as the schema documents it.
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["error"], "additionalProperties": False,
    "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"],
        "additionalProperties": False,
        "properties": {
            "message": {"type": "string"},
            "type": {"type": "string", "enum": ["invalid_request_error", "authentication_error",
                                               "permission_error", "rate_limit_error",
                                               "server_error"]},
            "param": {"anyOf": [{"type": "string"}, {"type": "null"}],
                      "description": "the field at fault (dotted path), or null"},
            "code": {"type": "string"}}}},
}
_JSON_ERROR = {"application/json": {"schema": ERROR_SCHEMA}}
#: The errors of every keyed route, in the schema: one JSON shape for any 4xx and 5xx, even on
#: routes whose success is a stream or a file (and, as a 4XX range is documented, FastAPI adds
#: no 422, which this gateway never sends).
RESPONSES: dict[int | str, dict[str, Any]] = {
    "4XX": {"content": _JSON_ERROR, "description": "the client's error: a 400 names the field "
            "in param; 401 no or a wrong key; 404 no such id; 405 (Allow lists the methods); "
            "409; 413; 416; 429 (Retry-After)"},
    "5XX": {"content": _JSON_ERROR, "description": "the fleet's error (503: its Redis or store "
            "does not answer)"},
}


def error_type(status: int) -> str:
    """OpenAI's ``type`` for ``status``: a 405 or 416 is the client's error, never the server's."""
    return TYPES.get(status, "invalid_request_error" if 400 <= status < 500 else "server_error")


def body(status: int, code: str, message: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type(status), "param": param,
                      "code": code}}


def respond(e: ApiRequestError) -> JSONResponse:
    return JSONResponse(body(e.status, e.code, e.message, e.param), e.status, headers=e.headers)


def not_found(what: str = "video") -> ApiRequestError:
    """The one answer for an unknown id, another tenant's id and a malformed id alike."""
    return ApiRequestError(404, "not_found", f"no such {what}")


def from_fleet(e: FramefleetError) -> ApiRequestError:
    """A fleet error raised while serving a request, as the status it means."""
    if isinstance(e, ApiRequestError):
        return e
    text = " ".join(str(e).split())
    if isinstance(e, InvalidJobError):
        match = _FIELD.match(text)
        # no field named (the message's size): the body as a whole
        field = match.group(1).split(", ")[0] if match else "body"
        return ApiRequestError(400, "invalid_value", text, field)
    if isinstance(e, JobConflictError):
        return ApiRequestError(409, "conflict", text)
    if isinstance(e, UnknownJobError):
        return not_found("job")
    if isinstance(e, BrokerError):
        return fleet_unavailable()
    return ApiRequestError(500, "internal_error", text)


#: What a 503 of the fleet's Redis asks a client to wait: a Sentinel failover or a healed
#: partition takes seconds.
UNAVAILABLE_RETRY_AFTER_S = 5


def fleet_unavailable() -> ApiRequestError:
    """The 503 of a Redis that does not answer (down, failing over, cut off), with the
    ``Retry-After`` a client waits before it tries again."""
    return ApiRequestError(503, "fleet_unavailable", "the fleet's Redis does not answer",
                           headers={"Retry-After": str(UNAVAILABLE_RETRY_AFTER_S)})


def _param(loc: tuple[Any, ...]) -> str | None:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    return ".".join(parts) or None


def install(app: FastAPI) -> None:
    """Route every error through the one shape."""

    @app.exception_handler(FramefleetError)
    async def _fleet(request: Request, e: FramefleetError) -> JSONResponse:
        return respond(from_fleet(e))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        errors = e.errors()
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        param = _param(tuple(first.get("loc", ())))
        message = "; ".join(f"{_param(tuple(x.get('loc', ()))) or 'request'}: {x.get('msg')}"
                            for x in errors) or "invalid request"
        return respond(ApiRequestError(400, "invalid_value", message, param))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException) -> JSONResponse:
        code = CODES.get(e.status_code, "http_error")
        message = "no such route" if e.status_code == 404 else str(e.detail)
        headers, param = dict(e.headers or {}), None
        if e.status_code == 400:
            param = "body"  # Starlette's own 400s: a form it cannot parse
        if e.status_code == 405:
            # Every method of the path, not only the first route's (RFC 9110 §15.5.6).
            methods = allowed(request.app.router.routes, request.scope)
            headers["Allow"] = ", ".join(methods)
            message = f"{request.method[:16]} is not allowed here; allowed: {', '.join(methods)}"
        return respond(ApiRequestError(e.status_code, code, message, param, headers))
