"""``/v1/files`` and ``/v1/batches``: many jobs in one request, in the shape of OpenAI's Batch
API (the ``openai`` SDK's ``client.files.create(purpose="batch")`` and ``client.batches.*``).

A JSON Lines file goes in through ``POST /v1/files`` (multipart: ``file``, ``purpose=batch``),
stored under the key's own input prefix (``FRAMEFLEET_API_INPUT_PREFIX``, as an
``input_reference``). ``POST /v1/batches`` (``input_file_id``, ``endpoint``: ``/v1/videos`` or
``/v1/jobs``, ``completion_window``: ``24h``) answers a batch id; ``GET /v1/batches/{id}`` its
status and counts; its ``output_file_id`` (each line's job, as that endpoint answers it) and
``error_file_id`` (each line refused, with the error that endpoint would answer) are read
with ``GET /v1/files/{id}/content``; ``POST /v1/batches/{id}/cancel`` stops it.

Each line, ``{"custom_id", "method": "POST", "url": ENDPOINT, "body"}``, is submitted as that
endpoint submits one request (``producer.api.submit``): the same checks, the claim of its job,
its idempotency (a native job's id is the client's: the same file again is the same jobs), and
the key's limits. A line over the key's jobs in flight waits in the batch, and is submitted
once jobs of the key end, on a later read of the batch (each read submits for at most
``PUMP_S``, one replica at a time); lines still waiting when the completion window ends are
refused as expired. A line refused is the error file's; the others go on. The batch is
``completed`` once every line is refused or its job ended; ``request_counts`` count the jobs
that succeeded, and the lines refused with the jobs that failed.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.datastructures import UploadFile

from producer.api.auth import Tenant
from producer.api.context import Gateway, GatewayDep, TenantDep
from producer.api.errors import RESPONSES, from_fleet, not_found
from producer.api.jsonbody import parse_json
from producer.api.store import parse
from producer.api.submit import VideoCreate, submit_job, submit_video
from producer.api.uploads import input_root
from producer.api.video import job_object, video_object
from producer.errors import ApiRequestError, FramefleetError
from producer.state import keys

#: Lines a batch may hold (OpenAI's limit too).
MAX_LINES = 50_000
#: Seconds one read of a batch spends submitting its waiting lines.
PUMP_S = 5.0
WINDOW_S = 24 * 3600
FileId = Annotated[str, Path(pattern=r"^file-[a-z0-9-]{1,80}$")]
BatchId = Annotated[str, Path(pattern=r"^batch_[0-9a-f]{32}$")]


class BatchCreate(BaseModel):
    """``POST /v1/batches``."""

    model_config = ConfigDict(extra="forbid")

    input_file_id: str = Field(pattern=r"^file-[0-9a-f]{32}$")
    endpoint: Literal["/v1/videos", "/v1/jobs"]
    completion_window: Literal["24h"]
    metadata: dict[str, Annotated[str, Field(max_length=512)]] | None = Field(
        default=None, max_length=16)


def _bad(param: str, message: str) -> ApiRequestError:
    return ApiRequestError(400, "invalid_value", f"{param}: {message}", param)


async def upload_file(request: Request, gw: GatewayDep, tenant: TenantDep) -> dict[str, Any]:
    """Take a batch's JSON Lines (checked line by line when a batch is made of it)."""
    form = await request.form(max_files=1, max_fields=16, max_part_size=1024)
    for name, _ in form.multi_items():
        if name not in ("file", "purpose"):  # the schema's two fields, and no other
            raise _bad(name or "body", "unexpected field (file and purpose only)")
    upload, purpose = form.get("file"), form.get("purpose")
    if not isinstance(upload, UploadFile):
        raise _bad("file", "required: the JSON Lines file, as a multipart file")
    if purpose != "batch":
        raise _bad("purpose", '"batch" (the only purpose this gateway takes)')
    data = await upload.read()
    if len(data) > gw.settings.api_max_upload_bytes:
        raise ApiRequestError(413, "body_too_large",
                              f"file: over {gw.settings.api_max_upload_bytes} bytes", "file")
    file_id = f"file-{secrets.token_hex(16)}"
    uri = f"{input_root(gw.settings, tenant.name)}/files/{file_id}.jsonl"
    record = {"id": file_id, "object": "file", "bytes": len(data), "created_at": int(time.time()),
              "filename": (upload.filename or "batch.jsonl")[:255], "purpose": "batch",
              "status": "processed", "status_details": None}
    await run_in_threadpool(gw.store.put, parse(uri), data, "application/jsonl")
    gw.registry.r.set(keys.api_file(tenant.name, file_id), json.dumps({**record, "uri": uri}),
                      ex=keys.API_RECORD_TTL_S)
    return record


def _file(gw: Gateway, tenant: Tenant, file_id: str) -> dict[str, Any]:
    raw = gw.registry.r.get(keys.api_file(tenant.name, file_id))
    if raw is None:
        raise not_found("file")
    record: dict[str, Any] = json.loads(raw)
    return record


def _lines(data: bytes, endpoint: str) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """Each line's first state (waiting with its request, or refused), and the file's own
    errors (none: its lines are the batch)."""
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return {}, ["the file is not UTF-8 text"]
    states: dict[int, dict[str, Any]] = {}
    seen: set[str] = set()
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if len(states) >= MAX_LINES:
            return {}, [f"more than {MAX_LINES} lines"]
        states[n] = _line(n, line, endpoint, seen)
    return states, ([] if states else ["the file holds no line"])


def _line(n: int, line: str, endpoint: str, seen: set[str]) -> dict[str, Any]:
    try:
        req = json.loads(line)
    except ValueError:
        return _refused("", 400, "invalid_json", f"line {n}: not JSON", "body", n)
    custom = req.get("custom_id") if isinstance(req, dict) else None
    if not isinstance(custom, str) or not 0 < len(custom) <= 256 or custom in seen:
        return _refused("", 400, "invalid_value", f"line {n}: custom_id: a string of 1-256 "
                        "characters, once in the file", "custom_id", n)
    seen.add(custom)
    if req.get("method") != "POST" or req.get("url") != endpoint:
        return _refused(custom, 400, "invalid_value", f"line {n}: method and url: POST "
                        f"{endpoint}, the batch's endpoint", "url", n)
    if not isinstance(req.get("body"), dict):
        return _refused(custom, 400, "invalid_value", f"line {n}: body: a JSON object",
                        "body", n)
    return {"line": n, "custom_id": custom, "state": "waiting", "body": req["body"]}


def _refused(custom: str, status: int, code: str, message: str, param: str | None,
             line: int | None = None) -> dict[str, Any]:
    return {"line": line, "custom_id": custom, "state": "refused",
            "error": {"status": status, "code": code, "message": message, "param": param}}


def _submit(gw: Gateway, tenant: Tenant, endpoint: str, body: dict[str, Any]) -> Any:
    """One line, as its endpoint submits one request: the job's view."""
    if endpoint == "/v1/jobs":
        return submit_job(gw, tenant, body)
    try:
        req = VideoCreate.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "body"
        raise _bad(field, str(err["msg"])) from None
    return submit_video(gw, tenant, req, None)


def _pump(gw: Gateway, tenant: Tenant, batch_id: str, rec: dict[str, Any],
          states: dict[int, dict[str, Any]]) -> None:
    """Submit the batch's waiting lines, in order, for at most ``PUMP_S``: until the key's
    jobs in flight are at its limit (the rest wait for a later read), one replica at a time."""
    r, key = gw.registry.r, keys.api_batch(tenant.name, batch_id)
    if not r.set(keys.api_batch_lock(tenant.name, batch_id), "1", nx=True,
                 px=int(PUMP_S * 1000 + 30_000)):
        return
    try:
        until = time.monotonic() + PUMP_S
        for n in sorted(states):
            st = states[n]
            if st["state"] != "waiting":
                continue
            if rec["status"] != "in_progress" or time.monotonic() > until:
                break
            try:
                view = _submit(gw, tenant, rec["endpoint"], st["body"])
            except (ApiRequestError, FramefleetError) as e:
                err = from_fleet(e)
                if err.code == "too_many_in_flight":
                    break  # it waits: the key's jobs end, and a later read submits it
                st = _refused(st["custom_id"], err.status, err.code, err.message, err.param, n)
            else:
                st = {"line": n, "custom_id": st["custom_id"], "state": "submitted",
                      "id": view.record.id}
            states[n] = st
            r.hset(key, str(n), json.dumps(st))
    finally:
        r.delete(keys.api_batch_lock(tenant.name, batch_id))


def _load(gw: Gateway, tenant: Tenant, batch_id: str) -> tuple[dict[str, Any],
                                                              dict[int, dict[str, Any]]]:
    raw = gw.registry.r.hgetall(keys.api_batch(tenant.name, batch_id))
    if not raw:
        raise not_found("batch")
    fields = {(k.decode() if isinstance(k, bytes) else k): v for k, v in raw.items()}
    rec = json.loads(fields.pop("record"))
    return rec, {int(n): json.loads(v) for n, v in fields.items()}


def _close_waiting(gw: Gateway, tenant: Tenant, rec: dict[str, Any],
                   states: dict[int, dict[str, Any]], code: str, message: str) -> None:
    """Refuse the lines still waiting (the window ended, or the batch was cancelled)."""
    key = keys.api_batch(tenant.name, rec["id"])
    for n, st in states.items():
        if st["state"] == "waiting":
            states[n] = _refused(st["custom_id"], 400, code, message, None, n)
            gw.registry.r.hset(key, str(n), json.dumps(states[n]))


def _save(gw: Gateway, tenant: Tenant, rec: dict[str, Any]) -> None:
    gw.registry.r.hset(keys.api_batch(tenant.name, rec["id"]), "record", json.dumps(rec))


def _views(gw: Gateway, tenant: Tenant, states: dict[int, dict[str, Any]]) -> dict[int, Any]:
    """The view of each submitted line's job (a record gone: counted as failed)."""
    views = {}
    for n, st in states.items():
        if st["state"] == "submitted":
            rec = gw.registry.get(tenant.name, st["id"])
            views[n] = gw.view(rec) if rec is not None else None
    return views


def batch_object(gw: Gateway, tenant: Tenant, rec: dict[str, Any],
                 states: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The OpenAI batch object, its status brought up to date (and saved when it ended)."""
    views = _views(gw, tenant, states)
    done = sum(1 for v in views.values() if v is not None and v.state.state == "SUCCESS")
    ended = sum(1 for v in views.values() if v is None or v.state.finished)
    refused = sum(1 for st in states.values() if st["state"] == "refused")
    waiting = any(st["state"] == "waiting" for st in states.values())
    now = int(time.time())
    if rec["status"] == "in_progress" and not waiting and ended == len(views):
        rec.update(status="completed", completed_at=now)
        _save(gw, tenant, rec)
    base = rec["id"].removeprefix("batch_")
    return {
        **rec,
        "request_counts": {"total": len(states), "completed": done,
                           "failed": refused + ended - done},
        "output_file_id": f"file-out-{base}" if views else None,
        "error_file_id": f"file-err-{base}" if refused else None,
    }


def _batch(gw: Gateway, tenant: Tenant, batch_id: str) -> dict[str, Any]:
    rec, states = _load(gw, tenant, batch_id)
    if rec["status"] == "in_progress" and time.time() > rec["expires_at"]:
        _close_waiting(gw, tenant, rec, states, "batch_expired",
                       "the batch's completion window ended before this line was submitted")
        rec.update(status="expired", expired_at=int(time.time()))
        _save(gw, tenant, rec)
    _pump(gw, tenant, batch_id, rec, states)
    return batch_object(gw, tenant, rec, states)


def _create(gw: Gateway, tenant: Tenant, req: BatchCreate) -> dict[str, Any]:
    file = _file(gw, tenant, req.input_file_id)
    _, body = gw.store.get(parse(file["uri"]))
    states, problems = _lines(b"".join(body), req.endpoint)
    now = int(time.time())
    batch_id = f"batch_{secrets.token_hex(16)}"
    rec: dict[str, Any] = {
        "id": batch_id, "object": "batch", "endpoint": req.endpoint,
        "input_file_id": req.input_file_id, "completion_window": req.completion_window,
        "status": "failed" if problems else "in_progress", "created_at": now,
        "in_progress_at": None if problems else now, "expires_at": now + WINDOW_S,
        "finalizing_at": None, "completed_at": None, "failed_at": now if problems else None,
        "expired_at": None, "cancelling_at": None, "cancelled_at": None,
        "metadata": req.metadata,
        "errors": {"object": "list", "data": [{"code": "invalid_file", "message": p,
                                               "param": "input_file_id", "line": None}
                                              for p in problems]} if problems else None,
    }
    key = keys.api_batch(tenant.name, batch_id)
    pipe = gw.registry.r.pipeline(transaction=False)
    pipe.hset(key, mapping={"record": json.dumps(rec),
                            **{str(n): json.dumps(st) for n, st in states.items()}})
    pipe.expire(key, keys.API_RECORD_TTL_S).execute()
    return _batch(gw, tenant, batch_id)


async def create_batch(request: Request, gw: GatewayDep, tenant: TenantDep) -> dict[str, Any]:
    data = parse_json(await request.body())
    try:
        req = BatchCreate.model_validate(data if data is not None else {})
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "body"
        raise _bad(field, str(err["msg"])) from None
    return await run_in_threadpool(_create, gw, tenant, req)


async def retrieve_batch(batch_id: BatchId, gw: GatewayDep,
                         tenant: TenantDep) -> dict[str, Any]:
    return await run_in_threadpool(_batch, gw, tenant, batch_id)


def _cancel(gw: Gateway, tenant: Tenant, batch_id: str) -> dict[str, Any]:
    rec, states = _load(gw, tenant, batch_id)
    if rec["status"] == "in_progress":
        now = int(time.time())
        rec.update(status="cancelled", cancelling_at=now, cancelled_at=now)
        _save(gw, tenant, rec)
        _close_waiting(gw, tenant, rec, states, "batch_cancelled",
                       "the batch was cancelled before this line was submitted")
        for view in _views(gw, tenant, states).values():
            if view is not None and not view.state.finished:
                gw.client.cancel(view.record.job_id, view.record.tenant)
    return batch_object(gw, tenant, rec, states)


async def cancel_batch(batch_id: BatchId, gw: GatewayDep, tenant: TenantDep) -> dict[str, Any]:
    """Lines still waiting are refused; the batch's jobs still queued or running are
    cancelled (each ends REVOKED: failed, code cancelled)."""
    return await run_in_threadpool(_cancel, gw, tenant, batch_id)


def _content(gw: Gateway, tenant: Tenant, file_id: str) -> bytes:
    kind, _, base = file_id.removeprefix("file-").partition("-")
    if kind not in ("out", "err") or not base:
        _, body = gw.store.get(parse(_file(gw, tenant, file_id)["uri"]))
        return b"".join(body)
    rec, states = _load(gw, tenant, f"batch_{base}")
    shape = video_object if rec["endpoint"] == "/v1/videos" else job_object
    views = _views(gw, tenant, states) if kind == "out" else {}
    lines = []
    for n in sorted(states):
        st, line_id = states[n], f"batch_req_{base[:16]}_{n}"
        if kind == "out" and n in views and views[n] is not None:
            lines.append({"id": line_id, "custom_id": st["custom_id"], "error": None,
                          "response": {"status_code": 200, "request_id": line_id,
                                       "body": shape(views[n])}})
        elif kind == "err" and st["state"] == "refused":
            e = st["error"]
            lines.append({"id": line_id, "custom_id": st["custom_id"], "error": None,
                          "response": {"status_code": e["status"], "request_id": line_id,
                                       "body": {"error": {
                                           "message": e["message"], "code": e["code"],
                                           "param": e["param"], "type": "invalid_request_error"
                                           if e["status"] < 500 else "server_error"}}}})
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


async def file_content(file_id: FileId, gw: GatewayDep, tenant: TenantDep) -> Response:
    data = await run_in_threadpool(_content, gw, tenant, file_id)
    return Response(data, media_type="application/jsonl")


_UPLOAD_BODY = {"required": True, "content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["file", "purpose"], "additionalProperties": False,
    "properties": {
        "file": {"type": "string", "format": "binary",
                 "description": "JSON Lines: one request per line"},
        "purpose": {"type": "string", "enum": ["batch"]}}}}}}
_BATCH_BODY = {"required": True, "content": {"application/json": {
    "schema": BatchCreate.model_json_schema()}}}

router = APIRouter(tags=["batches"], responses=RESPONSES)
router.add_api_route("/v1/files", upload_file, methods=["POST"],
                     summary="Upload a batch's JSON Lines",
                     openapi_extra={"requestBody": _UPLOAD_BODY})
router.add_api_route("/v1/files/{file_id}/content", file_content, methods=["GET"],
                     response_class=Response, summary="A file: uploaded, or a batch's output "
                     "or errors", responses={200: {"content": {"application/jsonl": {}}}})
router.add_api_route("/v1/batches", create_batch, methods=["POST"],
                     summary="Create a batch of a file's requests",
                     openapi_extra={"requestBody": _BATCH_BODY})
router.add_api_route("/v1/batches/{batch_id}", retrieve_batch, methods=["GET"],
                     summary="A batch's status and counts (submits its waiting lines)")
router.add_api_route("/v1/batches/{batch_id}/cancel", cancel_batch, methods=["POST"],
                     summary="Cancel a batch")
