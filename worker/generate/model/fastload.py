"""The fast load path of a checked Wan folder: safetensors shards straight to the device.

``diffusers``' ``from_pretrained(dtype=...)`` reads every shard into host memory, casts there
(float32 → bfloat16 of a 5B transformer: 20 GB read, 10 GB written, on a few cores), then
``.to("cuda")`` copies the result. Here each model component is built without weights
(parameters on the ``meta`` device, ``accelerate.init_empty_weights``; buffers built as
usual: the rotary tables are no checkpoint tensors), then its shards are opened with
``safetensors``' own ``safe_open(..., device=...)`` in ``FRAMEFLEET_LOAD_THREADS`` threads,
every shard of every component in one pool, and each tensor is cast on the device as it
arrives. The host holds one tensor per thread at most, never the model.

The result is the one ``from_pretrained(dtype=...)`` builds, bit for bit (tests compare every
tensor and dtype): floating tensors in the job's dtype except what the model keeps in float32
(diffusers: ``_keep_in_fp32_modules``; transformers: that list under float16 only, its
``_strict`` list under bfloat16 too); the rest as stored; tied weights tied again.

Every tensor a shard is read for is the one the index maps to it; a tensor the index names
that its shard lacks, or a model tensor no file provides, is a fatal ``InvalidJobError``
naming the file. The folder has been checked (``worker.generate.request.loader``) just before.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from producer.errors import InvalidJobError
from worker.generate.request.loader import FIELD, WEIGHTS

log = logging.getLogger(__name__)
#: Components built from a config and loaded from weights (the rest load with their library).
MODELS = ("transformer", "transformer_2", "vae", "text_encoder", "image_encoder")
LIBRARIES = ("diffusers", "transformers")


@dataclass
class LoadTimes:
    """Where a load's seconds went (wall clock)."""

    build_s: float = 0.0  # configs, empty models, tokenizer and scheduler
    read_s: float = 0.0  # shards read to the device and cast there (all threads, wall)
    cast_move_s: float = 0.0  # what is left: buffers moved, tied weights, the pipeline built
    bytes: int = 0  # bytes of the tensors read
    shards: int = 0
    per_component: dict[str, float] = field(default_factory=dict)  # thread seconds


def shard_plan(component: Path, library: str) -> dict[Path, list[str]]:
    """Each weights file of ``component`` and the tensors to read from it (all of a single
    file: None-free, read from its header)."""
    from safetensors import safe_open

    single = component / WEIGHTS[library]
    index = component / f"{WEIGHTS[library]}.index.json"
    if not index.exists():
        with safe_open(str(single), framework="pt") as f:
            return {single: list(f.keys())}
    weight_map = json.loads(index.read_text())["weight_map"]
    plan: dict[Path, list[str]] = {}
    for name, shard in weight_map.items():
        plan.setdefault(component / shard, []).append(name)
    return plan


def target_dtype(model: Any, library: str, name: str, stored: torch.dtype,
                 dtype: torch.dtype) -> torch.dtype:
    """The dtype ``from_pretrained(dtype=dtype)`` gives tensor ``name``, stored as ``stored``."""
    if not stored.is_floating_point:
        return stored
    parts = name.split(".")
    if library == "diffusers":
        keep = list(getattr(model, "_keep_in_fp32_modules", None) or [])
    else:
        keep = list(getattr(model, "_keep_in_fp32_modules_strict", None) or []) \
            if dtype in (torch.float16, torch.bfloat16) else []
        if dtype == torch.float16:
            keep += list(getattr(model, "_keep_in_fp32_modules", None) or [])
    return torch.float32 if any(k in parts for k in keep) else dtype


def _empty_model(folder: Path, name: str, library: str, cls_name: str) -> Any:
    from accelerate import init_empty_weights

    cls = getattr(importlib.import_module(library), cls_name)
    path = folder / name
    with init_empty_weights(include_buffers=False):
        if library == "diffusers":
            return cls.from_config(cls.load_config(str(path)))
        config = cls.config_class.from_pretrained(str(path))
        return cls._from_config(config)


def _read_shard(shard: Path, names: list[str], model: Any, library: str, dtype: torch.dtype,
                device: torch.device) -> tuple[dict[str, torch.Tensor], int]:
    """One shard's tensors, read onto ``device`` and cast there (one at a time: the host and
    the device hold one stored-dtype tensor of this thread at most)."""
    from safetensors import SafetensorError, safe_open

    out, size = {}, 0
    try:
        with safe_open(str(shard), framework="pt", device=str(device)) as f:
            present = set(f.keys())
            for key in names:
                if key not in present:
                    raise InvalidJobError(f"{FIELD}: {shard} has no tensor {key!r}, which its "
                                          "index maps to it")
                tensor = f.get_tensor(key)
                size += tensor.numel() * tensor.element_size()
                out[key] = tensor.to(target_dtype(model, library, key, tensor.dtype, dtype))
    except (SafetensorError, OSError) as e:
        raise InvalidJobError(f"{FIELD}: cannot read {shard}: {str(e)[:300]}") from e
    return out, size


def _assign(model: Any, tensors: dict[str, torch.Tensor], component: str) -> None:
    """Put the read tensors in place of the empty ones; refuse a model tensor left empty."""
    known = dict(model.named_parameters(remove_duplicate=False))
    buffers = dict(model.named_buffers(remove_duplicate=False))
    for key, tensor in tensors.items():
        module_name, _, leaf = key.rpartition(".")
        module = model.get_submodule(module_name)
        if key in known:
            module._parameters[leaf] = torch.nn.Parameter(tensor, requires_grad=False)
        elif key in buffers:
            module._buffers[leaf] = tensor
        else:  # as diffusers: a checkpoint tensor the model has no place for is skipped
            log.warning("%s: %s: unexpected tensor %s ignored", FIELD, component, key)
    if hasattr(model, "tie_weights"):
        model.tie_weights()
        _untie_given(model, tensors)
    empty = [n for n, p in model.named_parameters() if p.is_meta]
    if empty:
        raise InvalidJobError(f"{FIELD}: {component}: no weights file holds {empty[0]!r} "
                              f"({len(empty)} tensors missing)")


def _untie_given(model: Any, tensors: dict[str, torch.Tensor]) -> None:
    """Tying fills only what the checkpoint left out, as ``from_pretrained`` does: a tied name
    the checkpoint gives a value of its own (both sides stored, different) keeps that value in
    a tensor of its own."""
    params = dict(model.named_parameters(remove_duplicate=False))
    for key, tensor in tensors.items():
        param = params.get(key)
        if param is None or param.data_ptr() == tensor.data_ptr() or torch.equal(param, tensor):
            continue
        module_name, _, leaf = key.rpartition(".")
        model.get_submodule(module_name)._parameters[leaf] = torch.nn.Parameter(
            tensor, requires_grad=False)


def load_pipeline(folder: Path, pipeline: str, dtype: torch.dtype, device: torch.device,
                  threads: int, on_host: tuple[str, ...] = ()) -> tuple[Any, LoadTimes]:
    """``diffusers.<pipeline>.from_pretrained(folder, dtype=dtype)`` with its models on
    ``device`` (those of ``on_host`` on the CPU: the lean mode's text encoder), read as the
    module says. ``folder`` must have passed the loader's check."""
    cpu = torch.device("cpu")
    import diffusers

    times = LoadTimes()
    t0 = time.perf_counter()
    index = json.loads((folder / "model_index.json").read_text())
    parts: dict[str, Any] = {}
    jobs: list[tuple[str, Path, list[str]]] = []
    for name, value in index.items():
        if name.startswith("_") or not isinstance(value, list) or len(value) != 2:
            continue
        library, cls_name = value
        if library is None:
            parts[name] = None
            continue
        if library not in LIBRARIES:
            raise InvalidJobError(f"{FIELD}: {folder}/model_index.json: {name} is a {library} "
                                  "class; only diffusers and transformers are loaded")
        if name in MODELS:
            parts[name] = _empty_model(folder, name, library, cls_name)
            plan = shard_plan(folder / name, library)
            jobs += [(name, shard, names) for shard, names in plan.items()]
        else:
            cls = getattr(importlib.import_module(library), cls_name)
            parts[name] = cls.from_pretrained(str(folder / name))
    times.build_s = time.perf_counter() - t0

    t1 = time.perf_counter()
    libraries = {n: index[n][0] for n in parts if n in MODELS and parts[n] is not None}
    read: dict[str, dict[str, torch.Tensor]] = {n: {} for n in libraries}

    def work(job: tuple[str, Path, list[str]]) -> tuple[str, dict[str, torch.Tensor], int,
                                                         float]:
        name, shard, names = job
        t = time.perf_counter()
        where = cpu if name in on_host else device
        tensors, size = _read_shard(shard, names, parts[name], libraries[name], dtype, where)
        return name, tensors, size, time.perf_counter() - t

    # Biggest shards first: the pool's last thread does not start a large one alone at the end.
    jobs.sort(key=lambda j: -j[1].stat().st_size)
    with ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="load") as pool:
        for name, tensors, size, seconds in pool.map(work, jobs):
            read[name].update(tensors)
            times.bytes += size
            times.per_component[name] = times.per_component.get(name, 0.0) + seconds
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    times.read_s, times.shards = time.perf_counter() - t1, len(jobs)

    t2 = time.perf_counter()
    for name, tensors in read.items():
        model = parts[name]
        _assign(model, tensors, name)
        model.to(cpu if name in on_host else device)  # the buffers built on the host: small
        model.eval()
    cls = getattr(diffusers, pipeline)
    accepted = inspect.signature(cls.__init__).parameters
    extra = {k: v for k, v in index.items() if not k.startswith("_") and k not in parts
             and k in accepted}
    pipe = cls(**{k: v for k, v in parts.items() if k in accepted}, **extra)
    pipe.register_to_config(_name_or_path=str(folder))  # as from_pretrained records it
    times.cast_move_s = time.perf_counter() - t2
    log.info("%s: %d shards, %.2f GB read to %s in %.2f s (%d threads)", folder, times.shards,
             times.bytes / 1e9, device, times.read_s, threads)
    return pipe, times
