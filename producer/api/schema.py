"""``/openapi.json``: the OpenAPI document says exactly what this gateway accepts, so that a
client generated from it sends only requests the gateway takes.

FastAPI writes the routes, parameters and responses; the two request bodies that carry a job
are written here from the gateway's own configuration: the model map with each model's limits,
the fleet's limits, each model's folder where this host has it (its sizes' multiples and
reach), the webhook allow-list, and the key's input prefix (``producer.api.schema_videos``,
``producer.api.schema_jobs``). A key's inputs lie under a prefix of its own, so the document a
key asks for (``Authorization: Bearer KEY``) names that prefix; without a key it says any
tenant's. Schemathesis holds the gateway to it both ways (``positive_data_acceptance``,
``negative_data_rejection``: tests/e2e/test_api_fuzz.py).

What a schema cannot say stays in its descriptions: an upload must be an image (PNG, JPEG or
WebP), and a whole body is at most ``FRAMEFLEET_API_MAX_BODY_BYTES`` (413 beyond).
"""

from __future__ import annotations

import copy
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Header, Request
from fastapi.responses import JSONResponse

from producer.api.schema_jobs import job_body
from producer.api.schema_videos import create_body

router = APIRouter(include_in_schema=False)


def document(app: FastAPI, tenant: str | None) -> dict[str, Any]:
    """The OpenAPI document for ``tenant``'s key (None: without a key)."""
    gw = app.state.gateway
    doc = copy.deepcopy(FastAPI.openapi(app))  # FastAPI keeps its own, built once
    paths = doc["paths"]
    paths["/v1/videos"]["post"]["requestBody"] = create_body(gw.catalog, gw.settings)
    body = job_body(gw.catalog, gw.settings, tenant)
    body["description"] = ("A JobSpec without tenant and output, which the gateway sets; "
                           "job_id is the key's own id; generate.model and decoder.weights are "
                           "model names of the gateway's map; inputs lie under the key's "
                           "input prefix.")
    paths["/v1/jobs"]["post"]["requestBody"] = body
    doc["info"]["x-framefleet-tenant"] = tenant
    return doc


@router.get("/openapi.json")
def openapi(request: Request,
            authorization: Annotated[str | None, Header()] = None) -> JSONResponse:
    """The document; with a key, the key's own (a wrong key: 401)."""
    gw = request.app.state.gateway
    tenant = gw.authorize(authorization).name if authorization is not None else None
    return JSONResponse(document(request.app, tenant))
