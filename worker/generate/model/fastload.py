"""The fast load path of a checked Wan folder: safetensors shards straight to the device.

``diffusers``' ``from_pretrained(dtype=...)`` reads every shard into host memory, casts there
(float32 → bfloat16 of a 5B transformer: 20 GB read, 10 GB written, on a few cores), then
``.to("cuda")`` copies the result. Here each model component is built without weights
(parameters on the ``meta`` device, ``accelerate.init_empty_weights``; buffers built as
usual: the rotary tables are no checkpoint tensors), then its shards are opened with
``safetensors``' own ``safe_open(..., device=...)`` in ``FRAMEFLEET_LOAD_THREADS`` threads,
every shard of every component in one pool, and each tensor is cast on the device as it
arrives. The host holds one tensor per thread at most, never the model. A model's shards are
queued as soon as its empty model is built (the VAE's first: the worker's start builds its
decode graphs while the rest streams in), the tokenizer and the scheduler load beside the
reads, and a model whose weights are all in is assigned at once and handed on (``on_ready``).

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
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
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

    build_s: float = 0.0  # configs and empty models, shards queued as each is built
    read_s: float = 0.0  # from then until the last shard was read, cast and assigned
    ready_s: float = 0.0  # the two: the load's start until every weight is on its device
    cast_move_s: float = 0.0  # what is left: the pipeline built
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


#: Held while a model is built empty and while one is given its weights: accelerate's
#: ``init_empty_weights`` patches ``Module.register_parameter`` process-wide, so a model tied
#: or assigned in a reading thread meanwhile would get meta parameters (seen: a tied embedding
#: left empty).
_PATCHED = threading.Lock()


def _empty_model(folder: Path, name: str, library: str, cls_name: str) -> Any:
    from accelerate import init_empty_weights

    cls = getattr(importlib.import_module(library), cls_name)
    path = folder / name
    config = cls.load_config(str(path)) if library == "diffusers" else \
        cls.config_class.from_pretrained(str(path))
    with _PATCHED, init_empty_weights(include_buffers=False):
        if library == "diffusers":
            return cls.from_config(config)
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


def _plan(folder: Path, index: dict[str, Any]) -> list[tuple[str, str | None, str | None]]:
    """(name, library, class) of every component, checked, in the order they are built and
    read: the VAE first (the start builds its decode graphs while the rest streams in), then
    the others as the index lists them."""
    parts = []
    for name, value in index.items():
        if name.startswith("_") or not isinstance(value, list) or len(value) != 2:
            continue
        library, cls_name = value
        if library is not None and library not in LIBRARIES:
            raise InvalidJobError(f"{FIELD}: {folder}/model_index.json: {name} is a {library} "
                                  "class; only diffusers and transformers are loaded")
        parts.append((name, library, cls_name))
    return sorted(parts, key=lambda p: p[0] != "vae")


def import_classes(folder: Path, pipeline: str) -> None:
    """Import the pipeline's class and its components' (diffusers and transformers import
    them on first use: seconds of module imports), so that a load that follows reads."""
    import diffusers

    index = json.loads((folder / "model_index.json").read_text())
    for _, library, cls_name in _plan(folder, index):
        if library is not None and cls_name is not None:
            getattr(importlib.import_module(library), cls_name)
    getattr(diffusers, pipeline)


class _Reads:
    """The shards of every component in flight: a component whose last shard is read is
    assigned and handed to ``on_ready`` at once, by the thread that read that shard."""

    def __init__(self, on_host: tuple[str, ...], device: torch.device, dtype: torch.dtype,
                 on_ready: Callable[[str, Any], None] | None) -> None:
        self.on_host, self.device, self.dtype, self.on_ready = on_host, device, dtype, on_ready
        self.models: dict[str, tuple[Any, str]] = {}  # name → (empty model, library)
        self.left: dict[str, int] = {}
        self.tensors: dict[str, dict[str, torch.Tensor]] = {}
        self.lock = threading.Lock()
        self.times = LoadTimes()
        #: every model built empty: ``on_ready`` waits for it, so that what it starts (the
        #: start's decoder graphs compile) never runs while ``init_empty_weights`` patches
        #: ``Module.register_parameter`` process-wide
        self.built = threading.Event()
        self._local = threading.local()  # each reading thread's own CUDA stream

    def _stream(self) -> Any:
        """This thread's copy stream, made once. Not the default stream: what a load queues
        there (every shard's copies and casts) would hold up anything that waits for it, as
        a decode graph's build beside the load does (measured on an H100: the VAE's graphs
        started only once the last shard was in)."""
        stream = getattr(self._local, "stream", None)
        if stream is None:
            stream = self._local.stream = torch.cuda.Stream(self.device)
        return stream

    def add(self, name: str, model: Any, library: str, shards: int) -> None:
        with self.lock:
            self.models[name], self.left[name], self.tensors[name] = (model, library), shards, {}

    def read(self, name: str, shard: Path, names: list[str]) -> None:
        t = time.perf_counter()
        model, library = self.models[name]
        where = torch.device("cpu") if name in self.on_host else self.device
        if where.type == "cuda":
            stream = self._stream()
            with torch.cuda.stream(stream):
                tensors, size = _read_shard(shard, names, model, library, self.dtype, where)
            stream.synchronize()  # this shard's tensors are whole before anyone reads them
        else:
            tensors, size = _read_shard(shard, names, model, library, self.dtype, where)
        with self.lock:
            self.tensors[name].update(tensors)
            self.times.bytes += size
            self.times.per_component[name] = self.times.per_component.get(name, 0.0) + \
                time.perf_counter() - t
            self.left[name] -= 1
            done = self.left[name] == 0
            whole = self.tensors.pop(name) if done else {}
        if done:
            with _PATCHED:
                _assign(model, whole, name)
                model.to(where)  # the buffers built on the host: small
            model.eval()
            if self.on_ready is not None:
                self.built.wait()
                self.on_ready(name, model)


def _queue(folder: Path, index: dict[str, Any], parts: dict[str, Any], reads: _Reads,
           pool: ThreadPoolExecutor, beside: ThreadPoolExecutor, futures: list[Future[None]],
           others: dict[str, Future[Any]]) -> None:
    """Build each model empty and queue its shards' reads at once; queue the other parts'
    loads beside them."""
    for name, library, cls_name in _plan(folder, index):
        if library is None or cls_name is None:
            parts[name] = None
        elif name in MODELS:
            parts[name] = model = _empty_model(folder, name, library, cls_name)
            plan = shard_plan(folder / name, library)
            reads.add(name, model, library, len(plan))
            # Biggest shards first: the pool's last thread does not start a large one alone
            # at the end.
            for shard, names in sorted(plan.items(), key=lambda i: -i[0].stat().st_size):
                futures.append(pool.submit(reads.read, name, shard, names))
            reads.times.shards += len(plan)
        else:  # the tokenizer, the scheduler: beside the reads, off their path
            cls = getattr(importlib.import_module(library), cls_name)
            others[name] = beside.submit(cls.from_pretrained, str(folder / name))


def load_pipeline(folder: Path, pipeline: str, dtype: torch.dtype, device: torch.device,
                  threads: int, on_host: tuple[str, ...] = (),
                  on_ready: Callable[[str, Any], None] | None = None) -> tuple[Any, LoadTimes]:
    """``diffusers.<pipeline>.from_pretrained(folder, dtype=dtype)`` with its models on
    ``device`` (those of ``on_host`` on the CPU: the lean mode's text encoder), read as the
    module says. ``folder`` must have passed the loader's check.

    Each model's shards are queued as soon as its empty model is built (the VAE's first), so
    reading starts while the next model is built; the tokenizer and the scheduler load beside
    them. ``on_ready(name, model)``: called with each model once all its weights are on its
    device (from a reading thread), before the others are read. While it loads, decode graphs
    are not captured (``wan_capture.loading``)."""
    from worker.decoders.wan_capture import loading

    with loading():
        return _load(folder, pipeline, dtype, device, threads, on_host, on_ready)


def _load(folder: Path, pipeline: str, dtype: torch.dtype, device: torch.device, threads: int,
          on_host: tuple[str, ...], on_ready: Callable[[str, Any], None] | None,
          ) -> tuple[Any, LoadTimes]:
    import diffusers

    t0 = time.perf_counter()
    reads = _Reads(on_host, device, dtype, on_ready)
    times = reads.times
    index = json.loads((folder / "model_index.json").read_text())
    parts: dict[str, Any] = {}
    futures: list[Future[None]] = []
    others: dict[str, Future[Any]] = {}
    with ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="load") as pool, \
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="load-parts") as beside:
        try:
            _queue(folder, index, parts, reads, pool, beside, futures, others)
        finally:  # also when a model cannot be built: no reading thread waits for ever
            reads.built.set()
        times.build_s = time.perf_counter() - t0
        for future in futures:
            future.result()
        parts.update({name: future.result() for name, future in others.items()})
    # Each shard was synchronised on its own stream by the thread that read it; no
    # device-wide synchronisation: it would wait for (and break the capture of) a graph a
    # build records meanwhile.
    times.read_s = time.perf_counter() - t0 - times.build_s
    times.ready_s = time.perf_counter() - t0

    t2 = time.perf_counter()
    cls = getattr(diffusers, pipeline)
    accepted = inspect.signature(cls.__init__).parameters
    extra = {k: v for k, v in index.items() if not k.startswith("_") and k not in parts
             and k in accepted}
    pipe = cls(**{k: v for k, v in parts.items() if k in accepted}, **extra)
    pipe.register_to_config(_name_or_path=str(folder))  # as from_pretrained records it
    times.cast_move_s = time.perf_counter() - t2
    log.info("%s: %d shards, %.2f GB read to %s in %.2f s (%d threads; models built in "
             "%.2f s, reading beside)", folder, times.shards, times.bytes / 1e9, device,
             times.ready_s, threads, times.build_s)
    return pipe, times
