"""The request body of ``POST /v1/jobs`` as the gateway takes it: a ``JobSpec`` without the
places the gateway decides, with exactly one source.

- a generate job: per model of the map, the sizes, frame counts and steps it takes
  (``producer.api.accepts``), an image only for an image-to-video model, the speed tier's
  rules (fp8: a bfloat16 dtype, no LoRA), a last frame only after a first, and no decoder of
  its own (the model's VAE decodes);
- a latents job: per decoder, its presets, and weights by a model's name (or ``"random"``)
  for a Wan decoder, none for the pattern decoder.

Inputs lie under the key's input prefix (``FRAMEFLEET_API_INPUT_PREFIX/TENANT/``): the schema
a key reads names its own; without a key, any tenant's (``tenant`` None). Webhooks go where
the fleet's allow-list lets them (``producer.api.schema_parts.webhook_url``).
"""

from __future__ import annotations

from typing import Any

from producer.api.accepts import Accepts, accepts, first_side
from producer.api.catalog import Catalog, ModelEntry
from producer.api.reach import folder_reach
from producer.api.schema_parts import (
    NULL,
    PUBLIC_ID,
    PUBLIC_ID_CHARS,
    SEGMENT,
    inlined,
    literal,
    uri_under,
    webhook_url,
)
from producer.settings import Settings
from producer.wire.spec import (
    DECODER_PRESETS,
    RANDOM_WEIGHTS,
    DecoderSpec,
    GenerateSpec,
    InputSpec,
    NotifySpec,
    PipelineSpec,
    VideoSpec,
)

#: ``JobSpec``'s longest time limit.
MAX_TIME_LIMIT_S = 86_400
#: ``GenerateSpec``'s defaults a field left out takes.
DEFAULTS = {name: GenerateSpec.model_fields[name].default
            for name in ("width", "height", "num_frames", "num_inference_steps")}


def _absent(schema: dict[str, Any]) -> dict[str, Any]:
    """Left out or null."""
    return {"anyOf": [schema, NULL]} if schema != NULL else NULL


def _sizes(took: Accepts) -> list[dict[str, Any]]:
    """The widths and heights, one branch per band of heights (or per listed size); a side
    left out is its default, so it may be left out where that is in the branch."""
    branches = []
    pairs = [((w, w), (h, h)) for w, h in took.listed] if took.listed is not None else [
        ((first_side(took.width_step), b.widest), (b.low, b.high)) for b in took.bands]
    for (wlow, whigh), (hlow, hhigh) in pairs:
        sides = {"width": (wlow, whigh, took.width_step), "height": (hlow, hhigh, took.height_step)}
        props = {k: {"type": "integer", "minimum": lo, "maximum": hi, "multipleOf": step}
                 for k, (lo, hi, step) in sides.items()}
        required = [k for k, (lo, hi, step) in sides.items()
                    if not (lo <= DEFAULTS[k] <= hi and DEFAULTS[k] % step == 0)]
        branches.append({"properties": props, "required": required})
    return branches or [{"not": {}}]


def _generate(name: str, entry: ModelEntry, source: dict[str, Any],
              settings: Settings) -> dict[str, Any]:
    took = accepts(entry, folder_reach(entry.folder), settings)
    image = _absent(source) if took.image else NULL
    props: dict[str, Any] = {
        "model": {"const": name},
        "num_frames": {"type": "integer", "enum": list(took.frames)},
        "num_inference_steps": {"type": "integer", "minimum": 1, "maximum": took.steps},
        "image": image, "last_image": image,
    }
    required = ["model", "prompt"] + [
        k for k, ok in (("num_frames", DEFAULTS["num_frames"] in took.frames),
                        ("num_inference_steps", DEFAULTS["num_inference_steps"] <= took.steps))
        if not ok]
    return {"properties": props, "required": required, "anyOf": _sizes(took)}


def _generate_spec(catalog: Catalog, sources: tuple[dict[str, Any], dict[str, Any]],
                   settings: Settings) -> dict[str, Any]:
    """``generate``: ``sources`` are what an image and a LoRA may name."""
    schema = inlined(GenerateSpec)
    props = schema["properties"]
    props["model"] = {"type": "string", "enum": list(catalog.models),
                      "description": "a model name of the gateway's map"}
    props["loras"]["items"]["properties"]["uri"] = sources[1]
    schema["allOf"] = [
        {"anyOf": [_generate(name, entry, sources[0], settings)
                   for name, entry in catalog.models.items()]},
        # fp8 runs bfloat16 activations, and peft does not wrap its layers
        {"anyOf": [{"properties": {"tier": {"const": "exact"}}},
                   {"required": ["tier"], "properties": {
                       "tier": {"const": "fp8"}, "dtype": {"enum": ["auto", "bfloat16"]},
                       "loras": {"maxItems": 0}}}]},
        # a last frame needs a first
        {"anyOf": [{"properties": {"last_image": NULL}},
                   {"required": ["image"], "properties": {"image": {"type": "string"}}}]},
    ]
    return schema


def _sources(settings: Settings, tenant: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """What an input (and an image) and a LoRA may name: under the key's input prefix;
    without a key, under any tenant's (``<prefix>/<tenant>/…``); with no prefix, nothing."""
    prefix = settings.api_input_prefix
    if prefix is None:
        return {"not": {}}, {"not": {}}
    if tenant is not None:
        root = f"{prefix.rstrip('/')}/{tenant}"
        return uri_under(root), uri_under(root, ".safetensors")
    mine = f"{literal(prefix.rstrip('/'))}/{SEGMENT}(/{SEGMENT})*/"
    text = "an object under FRAMEFLEET_API_INPUT_PREFIX/<your tenant>/"
    return ({"type": "string", "pattern": f"^{mine}{SEGMENT}$", "description": text},
            {"type": "string", "pattern": f"^{mine}[A-Za-z0-9_-][A-Za-z0-9._-]{{0,115}}"
             r"\.safetensors$", "description": text})


def _decoder_branches(catalog: Catalog) -> list[dict[str, Any]]:
    """Per decoder: its presets; a Wan decoder's weights by model name, the pattern's none."""
    weights = {"type": "string", "enum": [RANDOM_WEIGHTS, *catalog.models],
               "description": '"random" (noise) or a model name of the map (its VAE)'}
    branches = []
    for name in ("wan2.1-vae", "wan2.2-vae", "pattern"):
        presets = ["auto", *DECODER_PRESETS.get(name, ("wan2.1", "tiny", "wan2.2",
                                                       "tiny-wan2.2"))]
        wan = name != "pattern"
        branches.append({
            "required": ["weights"] + ([] if name == "wan2.1-vae" else ["name"]),
            "properties": {"name": {"const": name}, "preset": {"enum": presets},
                           "weights": weights}} if wan else {
            "required": ["name"],
            "properties": {"name": {"const": name}, "preset": {"enum": presets},
                           "weights": NULL}})
    return branches


#: A generate job's ``decoder``: left out, or every field at its default.
_NO_DECODER = {"type": "object", "additionalProperties": False, "properties": {
    "name": {"const": "wan2.1-vae"}, "weights": NULL, "preset": {"enum": ["auto", "wan2.1"]},
    "dtype": {"const": "auto"}, "seed": {"const": 0}},
    "description": "a generate job decodes with its model's own VAE: leave decoder out"}


def job_body(catalog: Catalog, settings: Settings, tenant: str | None) -> dict[str, Any]:
    """``requestBody`` of ``POST /v1/jobs`` for ``tenant``'s key (None: any key)."""
    sources = _sources(settings, tenant)
    input_spec = inlined(InputSpec)
    input_spec["properties"]["uri"] = sources[0]
    hook = webhook_url(settings)
    notify = inlined(NotifySpec)
    if hook is not None:
        notify["properties"]["urls"]["items"] = hook
    output = settings.output_prefix
    props: dict[str, Any] = {
        "schema_version": {"const": 1},
        "job_id": {"type": "string", "maxLength": PUBLIC_ID_CHARS, "pattern": PUBLIC_ID,
                   "description": "the key's own id for the job"},
        "input": _absent(input_spec),
        "generate": _absent(_generate_spec(catalog, sources, settings)),
        "decoder": inlined(DecoderSpec), "video": inlined(VideoSpec),
        "pipeline": inlined(PipelineSpec),
        "priority": {"type": "integer", "minimum": 0, "maximum": 9},
        "time_limit_s": {"type": "integer", "minimum": 1,
                         "maximum": min(settings.max_time_limit_s, MAX_TIME_LIMIT_S)},
        "notify": _absent(notify) if hook is not None else NULL,
        "output": {"const": {"uri": output.rstrip("/")}} if output else {"not": {}},
    }
    if tenant is not None:
        props["tenant"] = {"const": tenant}
    schema = {
        "type": "object", "additionalProperties": False, "required": ["job_id"],
        "properties": props, "oneOf": [
            # latents: a Wan decoder needs weights, so the default decoder will not do
            {"required": ["input", "decoder"],
             "properties": {"input": {"type": "object"}, "generate": NULL,
                            "decoder": {"anyOf": _decoder_branches(catalog)}}},
            {"required": ["generate"], "properties": {"generate": {"type": "object"},
                                                      "input": NULL, "decoder": _NO_DECODER}}],
        "description": "A JobSpec (producer/wire/spec.py): exactly one of input (latents to "
        "decode) and generate (a prompt); the gateway sets the tenant and the output."}
    return {"required": True, "content": {"application/json": {"schema": schema}}}
