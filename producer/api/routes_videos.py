"""``/v1/videos``: the OpenAI Videos API shape (create, retrieve, list, delete, content)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from producer.api.context import Gateway, GatewayDep, TenantDep
from producer.api.errors import RESPONSES
from producer.api.files import content
from producer.api.jsonbody import parse_json
from producer.api.schema_parts import PUBLIC_ID, PUBLIC_ID_CHARS, PathId
from producer.api.store import parse
from producer.api.submit import VideoCreate, json_numbers, submit_video
from producer.api.video import video_object
from producer.errors import ApiRequestError

#: How soon the SDK's ``poll`` asks again (header ``openai-poll-after-ms``).
POLL_AFTER_MS = 500


#: The create request's integer fields, which a multipart form sends as their digits.
_FORM_INTEGERS = frozenset({"seed", "steps"})
_DIGITS = re.compile(r"[0-9]{1,20}")


def _invalid(e: ValidationError) -> ApiRequestError:
    err = e.errors()[0]
    # A field named "" (a form part without a name) is the body's fault: param is never null.
    field = ".".join(str(p) for p in err["loc"]) or "body"
    return ApiRequestError(400, "invalid_value", f"{field}: {err['msg']}", field)


async def _read(request: Request, gw: Gateway) -> tuple[VideoCreate, bytes | None]:
    """The create request from JSON or a multipart form (the SDK sends multipart)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    upload = None
    if kind in ("multipart/form-data", "application/x-www-form-urlencoded"):
        form = await request.form(max_files=1, max_fields=16, max_part_size=64 * 1024)
        fields: dict[str, Any] = {}
        for key, value in form.multi_items():
            if isinstance(value, UploadFile):
                if key != "input_reference":
                    raise ApiRequestError(400, "invalid_value", f"{key}: unexpected file", key)
                upload = await value.read()
            elif key in _FORM_INTEGERS and _DIGITS.fullmatch(value):
                fields[key] = int(value)  # a form's values are text; JSON's are typed
            else:
                fields[key] = value
    else:
        raw = await request.body()
        if len(raw) > gw.settings.api_max_body_bytes:
            raise ApiRequestError(413, "body_too_large",
                                  f"over {gw.settings.api_max_body_bytes} bytes")
        fields = json_numbers(parse_json(raw))
        if not isinstance(fields, dict):
            raise ApiRequestError(400, "invalid_value", "body: expected a JSON object", "body")
    try:
        return VideoCreate.model_validate(fields), upload
    except ValidationError as e:
        raise _invalid(e) from None


async def create(request: Request, gw: GatewayDep, tenant: TenantDep) -> dict[str, Any]:
    req, upload = await _read(request, gw)
    view = await run_in_threadpool(submit_video, gw, tenant, req, upload)
    return video_object(view)


def list_videos(
    gw: GatewayDep, tenant: TenantDep,
    after: Annotated[str | None, Query(max_length=PUBLIC_ID_CHARS, pattern=PUBLIC_ID)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
) -> dict[str, Any]:
    if after is not None:  # an id that names nothing is a 404, as for any lookup by id
        gw.lookup(tenant, after)
    records, more = gw.registry.page(tenant.name, after, limit, order)
    data = [video_object(gw.view(r)) for r in records]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": more}


def retrieve(video_id: PathId, gw: GatewayDep, tenant: TenantDep,
             response: Response) -> dict[str, Any]:
    view = gw.view(gw.lookup(tenant, video_id))
    if not view.state.finished:
        response.headers["openai-poll-after-ms"] = str(POLL_AFTER_MS)
    return video_object(view)


def delete(video_id: PathId, gw: GatewayDep, tenant: TenantDep) -> dict[str, Any]:
    """A job still queued or running is cancelled (``deleted: false``: it ends as failed,
    code ``cancelled``). A finished one is deleted with its outputs if the key may
    (``delete_outputs`` in the keys file); otherwise 403."""
    rec = gw.lookup(tenant, video_id)
    view = gw.view(rec)
    if not view.state.finished:
        gw.client.cancel(rec.job_id, rec.tenant)
        return {"id": rec.id, "object": "video.deleted", "deleted": False}
    if not tenant.delete_outputs:
        raise ApiRequestError(403, "delete_not_allowed",
                              "this key may not delete outputs (delete_outputs)")
    gw.store.delete_prefix(parse(rec.output))
    if rec.input_uri:
        gw.store.delete_prefix(parse(rec.input_uri.rsplit("/", 1)[0]))
    gw.registry.forget(rec)
    return {"id": rec.id, "object": "video.deleted", "deleted": True}


def video_content(video_id: PathId, request: Request, gw: GatewayDep, tenant: TenantDep,
                  variant: Literal["video"] = "video",
                  range_header: Annotated[str | None, Header(alias="range")] = None) -> Response:
    return content(gw, gw.lookup(tenant, video_id), range_header, head=request.method == "HEAD")


router = APIRouter(prefix="/v1/videos", tags=["videos"], responses=RESPONSES)
# Its body is written from the model map (producer.api.schema), as is POST /v1/jobs's.
router.add_api_route("", create, methods=["POST"], summary="Create a video")
router.add_api_route("", list_videos, methods=["GET"],
                     summary="List the key's videos, newest first")
router.add_api_route("/{video_id}", retrieve, methods=["GET"], summary="Retrieve a video")
router.add_api_route("/{video_id}", delete, methods=["DELETE"],
                     summary="Cancel a running video, or delete a finished one")
router.add_api_route("/{video_id}/content", video_content, methods=["GET"],
                     summary="The video as one MP4 (Range, or a redirect)",
                     response_class=Response, responses={
                         200: {"content": {"video/mp4": {}}},
                         206: {"description": "exactly the bytes asked for",
                              "content": {"video/mp4": {}}}})
router.add_api_route("/{video_id}/content", video_content, methods=["HEAD"],
                     response_class=Response, include_in_schema=False)
