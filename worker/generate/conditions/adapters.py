"""LoRA adapters of generate jobs, on the resident base model, with diffusers' own loader.

- **Read**: a ``.safetensors`` file (``file://`` inside the worker's roots, or ``s3://``),
  through the same bounded reader as latents, at most ``FRAMEFLEET_MAX_LORA_BYTES``. The
  content decides: a pickle or zip checkpoint is refused whatever its name, and nothing but
  ``safetensors`` parses it.
- **Checked before anything is loaded**: after diffusers' own key conversion
  (``lora_state_dict``: original Wan and musubi formats), every ``lora_A``/``lora_B`` must name
  a linear layer of the transformer with matching widths, and a LoRA whose metadata says it
  was made for another layout (``framefleet.made_for``, which ``models tiny --lora`` writes: a
  ti2v LoRA's widths fit a t2v model) is refused naming both. A LoRA for another model fails
  the job naming ``generate.loras[i]`` and the base model is untouched.
- **Loaded** with ``load_lora_weights`` (``load_into_transformer_2`` for a two-expert model's
  low-noise expert) under a name derived from the file's sha256, and kept for the next job
  that names the same file, within ``FRAMEFLEET_LORA_CACHE_MIB`` per resident model (the least
  recently used are deleted; the last one gone, peft's layers are unloaded too).
- **Per job**: ``set_adapters`` with the job's adapters and scales on each transformer, all
  others inactive; after the job, and for a job without LoRAs, the adapters are disabled, so
  its latents are those of a worker that never loaded one. While adapters are loaded, the
  model's transformer runs eager: peft's layers replace the linears its compiled blocks saw.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from producer.errors import InvalidJobError
from producer.settings import Settings
from producer.wire.spec import GenerateSpec, LoraSpec
from worker.inputs.tensorfile import HEAD, check_head
from worker.stores.storage import read_uri

log = logging.getLogger(__name__)
EXPERTS = {"both": ("transformer", "transformer_2"), "high_noise": ("transformer",),
           "low_noise": ("transformer_2",)}


@dataclass
class Loaded:
    """One adapter on one resident model: its name, size and the transformers holding it."""

    name: str
    bytes: int
    targets: set[str] = field(default_factory=set)


@dataclass
class Adapters:
    """The adapters loaded on one resident model, least recently used first."""

    loaded: OrderedDict[str, Loaded] = field(default_factory=OrderedDict)

    def any(self) -> bool:
        return bool(self.loaded)


def parse(data: bytes, field_name: str, uri: str) -> dict[str, Any]:
    """A safetensors file's tensors; anything else (a pickle above all) is refused."""
    check_head(data[:HEAD], len(data), field_name, uri)  # the one weights rule
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        return dict(load(data))
    except (SafetensorError, ValueError, RuntimeError) as e:
        raise InvalidJobError(f"{field_name}: {uri}: corrupt safetensors file: {e}") from None


def model_layout(pipe: Any) -> str:
    """The layout of ``pipe``'s model (``producer.wire.layouts.layout``: i2v, ti2v or t2v)."""
    from producer.wire.layouts import layout

    return layout(dict(pipe.transformer.config))


def check_made_for(pipe: Any, data: bytes, field_name: str, uri: str) -> None:
    """Refuse a LoRA whose safetensors metadata says it was made for another layout
    (``producer.wire.layouts``): a ti2v LoRA's widths fit a t2v model, so shapes cannot tell."""
    from producer.wire.layouts import check_made_for as check
    from producer.wire.layouts import made_for

    check(made_for(data), model_layout(pipe), field_name, uri)


def check_fits(pipe: Any, state: dict[str, Any], targets: tuple[str, ...], field_name: str,
               uri: str) -> dict[str, Any]:
    """diffusers' conversion of ``state``, refused unless every LoRA weight fits a linear
    layer of each target transformer. Returns the converted state."""
    import torch

    try:
        converted = pipe.lora_state_dict(dict(state))
    except (ValueError, KeyError, RuntimeError, IndexError) as e:
        raise InvalidJobError(f"{field_name}: {uri}: not a Wan LoRA diffusers can read: {e}") \
            from None
    if isinstance(converted, tuple):
        converted = converted[0]
    pairs = [k for k in converted if k.endswith((".lora_A.weight", ".lora_B.weight"))]
    if not pairs:
        raise InvalidJobError(f"{field_name}: {uri} holds no LoRA weights (lora_A / lora_B)")
    for target in targets:
        model = getattr(pipe, target)
        for key in pairs:
            if not key.startswith("transformer."):
                raise InvalidJobError(f"{field_name}: {uri}: {key} is not a transformer weight")
            path, kind = key[len("transformer."):].rsplit(".lora_", 1)
            try:
                layer = model.get_submodule(path)
            except AttributeError:
                raise InvalidJobError(f"{field_name}: {uri} does not fit this model: it has no "
                                      f"layer {path} ({target})") from None
            layer = getattr(layer, "base_layer", layer)  # under an adapter loaded before
            shape = tuple(converted[key].shape)
            fits = isinstance(layer, torch.nn.Linear) and (
                shape[1] == layer.in_features if kind.startswith("A") else
                shape[0] == layer.out_features)
            if not fits:
                have = tuple(layer.weight.shape) if hasattr(layer, "weight") else "not linear"
                raise InvalidJobError(f"{field_name}: {uri} does not fit this model: {key} has "
                                      f"shape {shape}, {target}'s {path} is {have}")
    return dict(converted)


def _load(pipe: Any, name: str, state: dict[str, Any], targets: tuple[str, ...],
          field_name: str, uri: str) -> None:
    done: list[str] = []
    try:
        for target in targets:
            pipe.load_lora_weights(dict(state), adapter_name=name,
                                   load_into_transformer_2=target == "transformer_2")
            done.append(target)
    except (ValueError, RuntimeError, KeyError) as e:
        for target in done:  # leave the base as it was
            getattr(pipe, target).delete_adapters(name)
        raise InvalidJobError(f"{field_name}: {uri}: could not be loaded: {e}") from None


def prepare(pipe: Any, adapters: Adapters, gen: GenerateSpec, settings: Settings,
            experts: int) -> tuple[list[tuple[str, LoraSpec, str, tuple[str, ...]]], float]:
    """Read, check and load the job's LoRAs (those not loaded already). Returns per LoRA
    (adapter name, spec, sha256, targets) and the seconds loading took."""
    t0 = time.perf_counter()
    used: list[tuple[str, LoraSpec, str, tuple[str, ...]]] = []
    loaded_any = False
    for i, lora in enumerate(gen.loras):
        field_name = f"generate.loras[{i}]"
        data = read_uri(lora.uri, settings.max_lora_bytes, settings, field=field_name)
        sha = hashlib.sha256(data).hexdigest()
        name = f"ff_{sha[:20]}"
        targets = EXPERTS[lora.expert] if experts == 2 else ("transformer",)
        entry = adapters.loaded.get(name)
        missing = tuple(t for t in targets if entry is None or t not in entry.targets)
        if missing:
            check_made_for(pipe, data, field_name, lora.uri)
            state = check_fits(pipe, parse(data, field_name, lora.uri), missing, field_name,
                               lora.uri)
            _load(pipe, name, state, missing, field_name, lora.uri)
            size = sum(t.numel() * t.element_size() for t in state.values())
            entry = adapters.loaded.setdefault(name, Loaded(name, 0))
            entry.bytes += size * len(missing)
            entry.targets.update(missing)
            loaded_any = True
            log.info("LoRA %s (%s) loaded into %s", lora.uri, name, ", ".join(missing))
        adapters.loaded.move_to_end(name)
        used.append((name, lora, sha, targets))
    _evict(pipe, adapters, {u[0] for u in used}, settings.lora_cache_mib * 2**20)
    return used, time.perf_counter() - t0 if loaded_any else 0.0


def _evict(pipe: Any, adapters: Adapters, keep: set[str], budget: int) -> None:
    for name in list(adapters.loaded):
        if sum(a.bytes for a in adapters.loaded.values()) <= budget:
            break
        if name in keep:
            continue
        gone = adapters.loaded.pop(name)
        for target in gone.targets:
            getattr(pipe, target).delete_adapters(name)
        log.info("LoRA %s unloaded (FRAMEFLEET_LORA_CACHE_MIB)", name)
    if not adapters.loaded:  # no adapter left: peft's layers go too
        for target in ("transformer", "transformer_2"):
            model = getattr(pipe, target, None)
            if model is not None and getattr(model, "_hf_peft_config_loaded", False):
                model.unload_lora()


@contextmanager
def active(pipe: Any, adapters: Adapters,
           used: list[tuple[str, LoraSpec, str, tuple[str, ...]]]) -> Iterator[None]:
    """The job's adapters at their scales on each transformer, the rest inactive; all
    disabled again afterwards."""
    models: list[tuple[str, Any]] = [
        (t, m) for t in ("transformer", "transformer_2")
        if (m := getattr(pipe, t, None)) is not None and adapters.any()
        and getattr(m, "_hf_peft_config_loaded", False)]
    try:
        for target, model in models:
            names = [u[0] for u in used if target in u[3]]
            if names:
                model.enable_lora()
                model.set_adapters(names, weights=[u[1].scale for u in used if target in u[3]])
            else:
                model.disable_lora()
        yield
    finally:
        for _, model in models:
            model.disable_lora()
