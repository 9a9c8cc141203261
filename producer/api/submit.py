"""Turn a request into a ``JobSpec`` and submit it through the producer client.

Both APIs end here: a ``/v1/videos`` request is built from the model map; a native
``/v1/jobs`` spec is taken whole, but what could name a place is the gateway's to say: the
tenant is the key's, the output folder is the fleet's prefix, the job id is derived from the
tenant's (``registry.fleet_id``), a model is a name from the map, and an input must lie under
the tenant's own input prefix. A generate job keeps its model's limits in the map
(``producer.api.catalog``), then the fleet's and, where this host has the model's folder, the
model's own (``producer.wire.fits``: every field at fault named, the same check as the
worker's). Then ``Client.submit`` checks the spec as it checks any other.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, field_validator

from producer.api.accepts import written
from producer.api.auth import Tenant
from producer.api.catalog import NATIVE_FIELDS, SIZE_RE, ModelEntry, check_limits, shape
from producer.api.context import Gateway
from producer.api.reach import folder_reach
from producer.api.registry import Record, fleet_id, new_video_id, valid_public_id
from producer.api.store import under
from producer.api.uploads import discard, image_fields, input_root, store_upload
from producer.api.video import View
from producer.errors import ApiRequestError
from producer.wire.fits import Names, faults
from producer.wire.rules import check_spec, fleet_limits
from producer.wire.spec import RANDOM_WEIGHTS, JobSpec, parse_spec

#: A full tenant waits for one of its jobs to end; it cannot know when, so: look again soon.
IN_FLIGHT_RETRY_S = 5
#: The ends after which the same spec submitted again runs again (``Client.submit``).
RERUN = frozenset({"FAILURE", "REVOKED"})


class VideoPreview(BaseModel):
    """``preview`` of ``POST /v1/videos``: a preview after denoise step 1 and every
    ``every``-th one (``GET /v1/jobs/{id}/events``, the page); 0: none. Left out: the
    worker's default (every 2 steps)."""

    model_config = ConfigDict(extra="forbid")

    every: StrictInt = Field(ge=0, le=10_000)


class VideoCreate(BaseModel):
    """``POST /v1/videos``, as JSON or as multipart form fields (plus ``input_reference``)."""

    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1, max_length=20_000)
    model: str | None = Field(default=None, max_length=64)
    # "0.5" or 0.5; as text, written as a number's shortest form (no exponent, sign, spaces
    # or trailing zeros): the schema lists each duration a model makes so
    seconds: Annotated[str, Field(max_length=16)] | StrictInt | StrictFloat | None = None
    size: str | None = Field(default=None, max_length=16)
    negative_prompt: str = Field(default="", max_length=20_000)
    # Strict: JSON's true or "2" is not a number of steps (a form's fields are text, and
    # routes_videos reads their digits as the number they spell).
    seed: StrictInt | None = Field(default=None, ge=0, le=2**63 - 1)
    steps: StrictInt | None = Field(default=None, ge=1, le=10_000)
    preview: VideoPreview | None = Field(
        default=None, description='previews while it denoises, e.g. {"every": 2}; a multipart '
        "form sends it as that JSON text; left out: the worker's default (every 2 steps)")

    @field_validator("preview", mode="before")
    @classmethod
    def _preview_text(cls, v: Any) -> Any:
        """A multipart form's field is text: its JSON object."""
        if isinstance(v, str):
            try:
                return json.loads(v)
            except ValueError:
                raise ValueError('expected a JSON object such as {"every": 2}') from None
        return v


#: What ``/v1/videos`` calls the quantities of the fleet's limits.
VIDEO_NAMES = Names(width="size", height="size", frames="seconds", steps="steps")


def json_numbers(data: Any) -> Any:
    """A JSON body's numbers as JSON Schema reads them: ``2.0`` is the integer 2, which the
    schema's integers take, and so does the gateway; ``2.5``, ``true`` and ``"2"`` are no
    integer. (The wire's own models stay strict: this is the HTTP API's reading of JSON.)
    The body's depth is bounded already (``producer.api.jsonbody``)."""
    if isinstance(data, float):
        return int(data) if data.is_integer() else data
    if isinstance(data, dict):
        return {k: json_numbers(v) for k, v in data.items()}
    if isinstance(data, list):
        return [json_numbers(v) for v in data]
    return data


def _bad(param: str, message: str) -> ApiRequestError:
    return ApiRequestError(400, "invalid_value", f"{param}: {message}", param)


def check_fits(gw: Gateway, entry: ModelEntry, width: int, height: int, frames: int,
               steps: int, names: Names) -> None:
    """The fleet's limits and the model's own (where this host has its folder): a 400
    naming every field at fault, ``param`` the first."""
    found = faults(width, height, frames, steps, folder_reach(entry.folder),
                   fleet_limits(gw.settings), names)
    if found:
        raise ApiRequestError(400, "invalid_value", "; ".join(found),
                              found[0].split(":", 1)[0])


def _reserve(gw: Gateway, tenant: Tenant, job_id: str) -> None:
    if not gw.registry.reserve(tenant.name, job_id, tenant.max_in_flight,
                               lambda ids: gw.finished(tenant.name, ids)):
        raise ApiRequestError(429, "too_many_in_flight",
                              f"{tenant.max_in_flight} jobs of this key are still running",
                              headers={"Retry-After": str(IN_FLIGHT_RETRY_S)})


def _send(gw: Gateway, tenant: Tenant, rec: Record, spec: JobSpec) -> View:
    """Register ``spec`` and submit it, once every check has passed: a request refused for
    any reason the rules know leaves no record (the client checks again when it submits)."""
    check_spec(spec, gw.client.settings)
    _reserve(gw, tenant, spec.job_id)
    rec, created = gw.registry.create(rec)
    rerun = not created and gw.client.state(rec.job_id, rec.tenant).state in RERUN
    try:
        gw.client.submit(spec)
    except BaseException:
        # A record this request made goes again (with its in-flight slot); one that was there
        # (a resubmit of the same id) stays: it is an earlier request's job.
        if created:
            gw.registry.forget(rec)
        raise
    if rerun:
        gw.registry.restart(rec)
    return gw.view(rec)


#: A duration as text: a number's shortest form.
SECONDS_RE = re.compile(r"^(0|[1-9][0-9]*)(\.[0-9]*[1-9])?$")


def _seconds(value: str | int | float | None) -> str | None:
    """A duration as ``shape`` reads it: a number's shortest form, text written so."""
    if value is None:
        return None
    if isinstance(value, str):
        if not SECONDS_RE.match(value):
            raise _bad("seconds", f"{value[:32]!r}: write a duration as a plain number such as "
                       "5, 0.5 or 1.25 (no sign, exponent, spaces or trailing zeros)")
        return value
    try:
        return written(Decimal(repr(value)))
    except InvalidOperation:
        raise _bad("seconds", f"{value!r} is not a number of seconds") from None


def submit_video(gw: Gateway, tenant: Tenant, req: VideoCreate,
                 upload: bytes | None) -> View:
    """A prompt (and an image) for a model of the map."""
    name, entry = gw.catalog.get(req.model)
    if req.size is not None and not SIZE_RE.match(req.size):
        raise _bad("size", f"expected WIDTHxHEIGHT such as {entry.size}, got {req.size[:32]!r}")
    dims = shape(entry, req.size, _seconds(req.seconds), req.steps, image=upload is not None,
                 reach=folder_reach(entry.folder))
    check_fits(gw, entry, dims.width, dims.height, dims.frames, dims.steps, VIDEO_NAMES)
    public = new_video_id()
    job_id = fleet_id(tenant.name, public)
    generate: dict[str, Any] = {
        "model": entry.folder, "prompt": req.prompt, "negative_prompt": req.negative_prompt,
        "width": dims.width, "height": dims.height, "num_frames": dims.frames,
        "num_inference_steps": dims.steps, "guidance_scale": entry.guidance,
        "guidance_scale_2": entry.guidance_2, "dtype": entry.dtype,
        "seed": req.seed if req.seed is not None else secrets.randbelow(2**31),
    }
    if req.preview is not None:
        generate["preview"] = {"every": req.preview.every}
    image_uri = None
    if upload is not None:
        image_uri = store_upload(gw.store, gw.settings, tenant.name, public, upload)
    rec = Record(id=public, job_id=job_id, tenant=tenant.name, api="videos",
                 created_at=time.time(), output=f"{gw.output_prefix}/{tenant.name}/{job_id}",
                 model=name, size=dims.size, seconds=dims.seconds, prompt=req.prompt,
                 tier=entry.tier, input_uri=image_uri)
    try:
        if image_uri is not None:
            generate |= image_fields(image_uri)
        spec = parse_spec({
            "job_id": job_id, "tenant": tenant.name, "generate": generate,
            "video": {"fps": entry.fps, "stitch": True}, "output": {"uri": gw.output_prefix},
        })
        return _send(gw, tenant, rec, spec)
    except BaseException:
        if image_uri is not None:  # a fresh id: nothing of a refused request stays
            discard(gw.store, image_uri)
        raise


def _inputs(gw: Gateway, tenant: Tenant, data: dict[str, Any]) -> None:
    """Every input URI a native spec names must lie under the tenant's input prefix."""
    found: list[tuple[str, Any]] = []
    if isinstance(data.get("input"), dict):
        found.append(("input.uri", data["input"].get("uri")))
    gen = data.get("generate")
    if isinstance(gen, dict):  # null: none, as left out
        found += [(f"generate.{k}", gen[k]) for k in ("image", "last_image")
                  if gen.get(k) is not None]
        for i, lora in enumerate(gen.get("loras") or []):
            found.append((f"generate.loras[{i}].uri", lora.get("uri")
                          if isinstance(lora, dict) else lora))
    for field, uri in found:
        root = input_root(gw.settings, tenant.name)
        if not isinstance(uri, str) or not under(uri, root):
            raise _bad(field, f"must be an s3:// object under this key's input prefix {root}/")


def _models(gw: Gateway, data: dict[str, Any]) -> ModelEntry | None:
    """Model and decoder weights by name: the map's folder, never a client's path. Returns
    the generate model's entry (its limits apply to the job)."""
    entry = None
    gen = data.get("generate")
    if isinstance(gen, dict) and "model" in gen:
        try:
            _, entry = gw.catalog.get(str(gen["model"]))
        except ApiRequestError as e:  # the native field is generate.model, not model
            raise ApiRequestError(e.status, e.code, f"generate.model: {e.message}",
                                  "generate.model") from None
        data["generate"] = {**gen, "model": entry.folder}
    decoder = data.get("decoder")
    weights = decoder.get("weights") if isinstance(decoder, dict) else None
    if weights is not None and weights != RANDOM_WEIGHTS:
        if not isinstance(weights, str) or weights not in gw.catalog.models:
            raise _bad("decoder.weights", '"random" or a model name of this gateway')
        assert isinstance(decoder, dict)
        data["decoder"] = {**decoder, "weights": gw.catalog.models[weights].folder + "/vae"}
    return entry


def _limits(gw: Gateway, entry: ModelEntry | None, spec: JobSpec) -> None:
    """The map's limits on a native generate job, then the fleet's and the model's: the same
    checks as ``/v1/videos``."""
    gen = spec.generate
    if gen is None or entry is None:
        return
    check_limits(entry, gen.width, gen.height, gen.num_frames, gen.num_inference_steps,
                 gen.image is not None or gen.last_image is not None, NATIVE_FIELDS,
                 folder_reach(entry.folder))
    check_fits(gw, entry, gen.width, gen.height, gen.num_frames, gen.num_inference_steps,
               Names())


def _decoder_name(data: dict[str, Any]) -> str:
    decoder = data.get("decoder")
    return str(decoder.get("name", "wan2.1-vae")) if isinstance(decoder, dict) else "wan2.1-vae"


def submit_job(gw: Gateway, tenant: Tenant, data: Any) -> View:
    """A whole ``JobSpec`` (native API), its places decided by the gateway."""
    if not isinstance(data, dict):
        raise _bad("spec", "expected a JSON object (a JobSpec)")
    data = dict(data)
    public = data.get("job_id")
    if not isinstance(public, str) or not valid_public_id(public):
        raise _bad("job_id", "required: [A-Za-z0-9_-][A-Za-z0-9._-]{0,99}, no '..'")
    if data.get("tenant", tenant.name) != tenant.name:
        raise _bad("tenant", "the tenant is the API key's; leave it out")
    if data.get("output", {"uri": gw.output_prefix}) != {"uri": gw.output_prefix}:
        raise _bad("output", "the gateway writes under the fleet's output prefix; leave it out")
    _inputs(gw, tenant, data)
    name = data["generate"].get("model") if isinstance(data.get("generate"), dict) else None
    entry = _models(gw, data)
    job_id = fleet_id(tenant.name, public)
    data |= {"job_id": job_id, "tenant": tenant.name, "output": {"uri": gw.output_prefix}}
    spec = parse_spec(data)
    _limits(gw, entry, spec)
    gen = spec.generate
    rec = Record(id=public, job_id=job_id, tenant=tenant.name, api="jobs",
                 created_at=time.time(), output=f"{gw.output_prefix}/{tenant.name}/{job_id}",
                 model=str(name) if name else _decoder_name(data), generate=gen is not None,
                 prompt=gen.prompt if gen else None)
    return _send(gw, tenant, rec, spec)
