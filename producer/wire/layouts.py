"""Which layout a Wan model is, and which layout a LoRA says it was made for.

A layout is what ``framefleet models tiny --layout`` names: ``i2v`` (image channels beside the
noise: the transformer takes more channels than it gives), ``ti2v`` (Wan2.2 TI2V's 48 latent
channels) or ``t2v``. A LoRA's shapes cannot always tell them apart (a ti2v LoRA's widths fit
a t2v model), so a LoRA written by ``models tiny --lora`` records its layout in its
safetensors metadata (:data:`LORA_MADE_FOR`), and a model of another layout refuses it,
naming both.

One rule, read in two places: by the submitting host before anything is queued, for the files
it can see (``producer.wire.rules.check_local_files``), and by the worker on the bytes it
loads (``worker.generate.conditions.adapters``). Small bounded reads, no torch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from producer.errors import InvalidJobError

#: The safetensors metadata key where a LoRA records the layout it was made for.
LORA_MADE_FOR = "framefleet.made_for"
#: A config.json is a few KB; a larger one is not read here (the worker judges it).
MAX_CONFIG_BYTES = 1024**2
#: A LoRA's safetensors header (names, shapes, offsets) is a few KB; a larger one is not read.
MAX_HEADER_BYTES = 1024**2
#: diffusers' WanTransformer3DModel default when a config leaves the channels out.
DEFAULT_CHANNELS = 16


def read_json(path: Path) -> dict[str, Any]:
    """A small JSON object from ``path``: ``ValueError`` when it is over
    :data:`MAX_CONFIG_BYTES` or not an object, ``OSError`` when it cannot be read."""
    with path.open("rb") as f:
        raw = f.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise ValueError(f"{path} is over {MAX_CONFIG_BYTES} bytes")
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON object")
    return data


def layout(transformer: Mapping[str, Any]) -> str:
    """The layout of a model from its transformer's config (parsed ``config.json``)."""
    out = transformer.get("out_channels", DEFAULT_CHANNELS)
    if transformer.get("in_channels", DEFAULT_CHANNELS) != out:
        return "i2v"
    return "ti2v" if out == 48 else "t2v"


def made_for(data: bytes) -> str | None:
    """The layout a safetensors file (its first bytes: the length and the header) says it
    was made for; None where it says nothing or the header does not parse (the loader names
    what is wrong with such a file)."""
    size = int.from_bytes(data[:8], "little")
    if len(data) < 8 or size > MAX_HEADER_BYTES or len(data) < 8 + size:
        return None
    try:
        head = json.loads(data[8:8 + size])
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser's
        return None
    meta = head.get("__metadata__") if isinstance(head, dict) else None
    value = meta.get(LORA_MADE_FOR) if isinstance(meta, dict) else None
    return value if isinstance(value, str) else None


def read_made_for(path: Path) -> str | None:
    """:func:`made_for` of the file at ``path``, reading its header only."""
    with path.open("rb") as f:
        start = f.read(8)
        size = int.from_bytes(start, "little")
        if len(start) < 8 or size > MAX_HEADER_BYTES:
            return None
        return made_for(start + f.read(size))


def check_made_for(lora_layout: str | None, model_layout: str, field: str, uri: str) -> None:
    """``InvalidJobError`` naming both layouts when the LoRA says it was made for another."""
    if lora_layout and lora_layout != model_layout:
        raise InvalidJobError(f"{field}: {uri} is a LoRA made for a {lora_layout} model; "
                              f"this model is {model_layout}")
