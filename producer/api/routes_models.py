"""``GET /v1/models``: the model names a key may ask for, in the shape of OpenAI's model list
(the ``openai`` SDK's ``client.models.list()`` reads it), each with what a form needs: its
default size and seconds, whether it takes an input image, and its limits. The page's create
form fills its model field from it. The first is the default (a request without ``model``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from producer.api.context import GatewayDep, TenantDep
from producer.api.errors import RESPONSES

router = APIRouter(prefix="/v1/models", tags=["models"], responses=RESPONSES)


@router.get("", summary="The models a video may be made with")
def list_models(gw: GatewayDep, tenant: TenantDep) -> dict[str, Any]:
    """Every model of the gateway's map (``FRAMEFLEET_API_MODELS_FILE``), in its order."""
    return {"object": "list", "data": [
        {"id": name, "object": "model", "created": 0, "owned_by": "framefleet",
         "size": entry.size, "seconds": entry.seconds, "fps": entry.fps, "steps": entry.steps,
         "image_to_video": entry.image_to_video,
         "limits": entry.limits.model_dump(mode="json")}
        for name, entry in gw.catalog.models.items()]}
