"""The request body of ``POST /v1/videos`` as the gateway takes it: per model of the map, the
sizes, durations and steps it makes (``producer.api.accepts``), in JSON and as a multipart
form (the ``openai`` SDK's shape)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from producer.api.accepts import Accepts, accepts, seconds
from producer.api.catalog import Catalog, ModelEntry
from producer.api.reach import folder_reach
from producer.api.schema_parts import NULL
from producer.settings import Settings

PROMPT_CHARS = 20_000


def _number(text: str) -> int | float:
    value = Decimal(text)
    return int(value) if value == value.to_integral_value() else float(value)


def _model(name: str, entry: ModelEntry, first: bool, settings: Settings,
           form: bool) -> dict[str, Any]:
    """The branch of one model: its name (the first one may be left out) and what it takes.
    A field left out takes the model's default, so it may be left out where that is taken."""
    took: Accepts = accepts(entry, folder_reach(entry.folder), settings)
    sizes = [f"{w}x{h}" for w, h in took.sizes()]
    durations = seconds(entry, took.frames)
    texts = list(durations)
    props: dict[str, Any] = {
        "model": {"enum": [name, None]} if first and not form else {"const": name},
        "size": {"enum": sizes},
        "seconds": {"anyOf": [{"type": "string", "enum": texts},
                              {"type": "number", "enum": [_number(t) for t in texts]}]},
        "steps": {"type": "integer", "minimum": 1, "maximum": took.steps},
    }
    if form:  # text fields: the digits of a number
        props["seconds"] = {"type": "string", "enum": texts}
    defaults = {"size": entry.size in sizes, "steps": entry.steps <= took.steps,
                "seconds": Decimal(entry.seconds) in {Decimal(t) for t in texts}}
    if not form:  # null: the model's default
        props |= {k: {"anyOf": [props[k], NULL]} for k, ok in defaults.items() if ok}
    required = ([] if first else ["model"]) + [k for k, ok in defaults.items() if not ok]
    if form:
        props["input_reference"] = {"type": "string", "format": "binary",
                                    "description": "the first frame: PNG, JPEG or WebP"} \
            if took.image and settings.api_input_prefix else {"not": {}}
    return {"properties": props, "required": required}


def _common(form: bool) -> dict[str, Any]:
    common: dict[str, Any] = {
        "prompt": {"type": "string", "minLength": 1, "maxLength": PROMPT_CHARS},
        "negative_prompt": {"type": "string", "maxLength": PROMPT_CHARS},
        "model": {"type": "string"},
        "size": {"type": "string", "description": "WIDTHxHEIGHT, one the model makes"},
        "seconds": {"type": "string", "description": "a duration the model makes, written "
                    "as listed (0.5, 1, 1.25: no exponent, no trailing zeros), or that number"},
        "seed": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
        "steps": {"type": "integer", "minimum": 1},
        "preview": {"type": "object", "additionalProperties": False, "required": ["every"],
                    "properties": {"every": {"type": "integer", "minimum": 0,
                                             "maximum": 10_000}},
                    "description": 'previews while it denoises, e.g. {"every": 2}: after step '
                    "1 and every N-th step (N over the steps: after step 1 only); 0: none; "
                    "left out: the worker's default (every 2 steps)"},
    }
    if form:
        common["input_reference"] = {"type": "string", "format": "binary"}
        return common
    common["seconds"] = {"anyOf": [common["seconds"], {"type": "number"}]}
    return {k: (v if k in ("prompt", "negative_prompt") else {"anyOf": [v, NULL]})
            for k, v in common.items()}


def create_body(catalog: Catalog, settings: Settings) -> dict[str, Any]:
    """``requestBody`` of ``POST /v1/videos``."""
    content = {}
    for kind, form in (("application/json", False), ("multipart/form-data", True)):
        branches = [_model(name, entry, i == 0, settings, form)
                    for i, (name, entry) in enumerate(catalog.models.items())]
        schema: dict[str, Any] = {"type": "object", "additionalProperties": False,
                                  "required": ["prompt"], "properties": _common(form),
                                  "anyOf": branches}
        content[kind] = {"schema": schema}
    return {"required": True, "content": content}
