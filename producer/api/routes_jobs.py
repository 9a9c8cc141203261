"""``/v1/jobs``: the native API. A whole ``JobSpec`` in, the fleet's own states out, with a
Server-Sent Events stream and the job's files."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.sse import EventSourceResponse, ServerSentEvent

from producer.api.context import GatewayDep, TenantDep
from producer.api.errors import RESPONSES
from producer.api.events import job_events
from producer.api.files import serve
from producer.api.jsonbody import parse_json
from producer.api.registry import Record
from producer.api.schema_parts import FileName, PathId
from producer.api.streams import Slot
from producer.api.submit import json_numbers, submit_job
from producer.api.video import job_object

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=RESPONSES)


# Its body is written from the model map and the key (producer.api.schema).
@router.post("", summary="Submit a JobSpec")
async def create_job(request: Request, gw: GatewayDep, tenant: TenantDep) -> dict[str, Any]:
    # Read here, not through a Body parameter: FastAPI turns any error while reading a body
    # into a 400, and an over-long body must stay the 413 that the limit raises.
    spec = json_numbers(parse_json(await request.body()))
    view = await run_in_threadpool(submit_job, gw, tenant, spec)
    return job_object(view)


@router.get("/{job_id}", summary="A job's state, progress and result")
def get_job(job_id: PathId, gw: GatewayDep, tenant: TenantDep) -> dict[str, Any]:
    return job_object(gw.view(gw.lookup(tenant, job_id, "job")))


@router.delete("/{job_id}", summary="Cancel a job")
def cancel_job(job_id: PathId, gw: GatewayDep, tenant: TenantDep) -> dict[str, Any]:
    rec = gw.lookup(tenant, job_id, "job")
    state = gw.client.cancel(rec.job_id, rec.tenant)
    return {"id": rec.id, "object": "framefleet.job.cancel", "was": state}


def _record(job_id: PathId, gw: GatewayDep, tenant: TenantDep) -> Record:
    # A dependency: an unknown id is a 404 before the stream starts.
    return gw.lookup(tenant, job_id, "job")


def _slot(gw: GatewayDep, tenant: TenantDep,
          rec: Annotated[Record, Depends(_record)]) -> Iterator[Slot]:
    # Taken before the stream starts (over the cap: a 429, not a stream), given back after
    # the response ends: FastAPI closes a request's dependencies once it has been sent.
    slot = gw.streams.open(tenant.name, tenant.max_streams)
    try:
        yield slot
    finally:
        slot.close()


@router.get("/{job_id}/events", response_class=EventSourceResponse,
            summary="Server-Sent Events: state, preview, segment, end")
async def events(gw: GatewayDep, rec: Annotated[Record, Depends(_record)],
                 slot: Annotated[Slot, Depends(_slot)]) -> AsyncIterator[ServerSentEvent]:
    async for e in job_events(gw, rec, slot):
        yield e


def job_file(job_id: PathId, name: FileName, request: Request, gw: GatewayDep, tenant: TenantDep,
             range_header: Annotated[str | None, Header(alias="range")] = None) -> Response:
    return serve(gw, gw.lookup(tenant, job_id, "job"), name, range_header,
                 head=request.method == "HEAD")


router.add_api_route(
    "/{job_id}/files/{name:path}", job_file, methods=["GET"], response_class=Response,
    summary="A file of the job: index.m3u8, segment-NNNNN.mp4, full.mp4, manifest.json, "
    "previews/step-NNNN.mp4, previews/latest.mp4")
# HEAD: the same status and headers, no body (a route of its own: one operation id each).
router.add_api_route("/{job_id}/files/{name:path}", job_file, methods=["HEAD"],
                     response_class=Response, include_in_schema=False)
