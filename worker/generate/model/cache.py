"""Generation pipelines kept resident on the worker's GPU, under one memory budget.

A worker process keeps the models it ran last, as it keeps decoders (``DecoderCache`` in
``worker/run/decoders.py`` owns one of these as ``.models``): loading a Wan pipeline takes
seconds to minutes, a job should not pay it. Entries are charged the bytes of their parameters and
buffers on the device; beyond ``budget_bytes`` the least recently used are dropped. A model
alone larger than the budget is refused (a fatal error naming ``generate.model``).

Entries are keyed on the folder, the dtype and the tier (``worker.generate.tier.tiers``): an fp8
copy and an exact copy of one model are two residents under the one budget, and a job gets the
copy of its own tier, never the other. On CUDA each resident's transformer blocks are compiled
(``FRAMEFLEET_COMPILED_SIZES`` sizes at most per resident).

With ``offload_text_encoder`` the text encoder (UMT5-XXL: 5.7 B parameters, 11.4 GB in bf16)
lives on the host between jobs and is charged nothing: a job moves it to the GPU to encode
its prompt and back afterwards (``worker/generate/conditions/text.py``). The decoder of a
generate job wraps the pipeline's own VAE, so it costs no second copy.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from producer.errors import InvalidJobError
from worker.generate.model import fastload
from worker.generate.request import loader
from worker.generate.request.loader import recheck
from worker.generate.tier.tiers import allow_recompiles, prepare

log = logging.getLogger(__name__)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def module_bytes(module: Any) -> int:
    """Bytes of a module's parameters and buffers."""
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


#: A resident's key: its folder, dtype and tier.
Key = tuple[str, torch.dtype, str]


def device_modules(pipe: Any) -> list[Any]:
    """The components that live on the worker's device (the text encoder aside)."""
    names = ("transformer", "transformer_2", "vae", "image_encoder")
    return [m for m in (getattr(pipe, n, None) for n in names) if m is not None]


@dataclass
class Resident:
    """One loaded pipeline and what the cache knows about it."""

    pipe: Any
    folder: Path
    dtype: torch.dtype
    bytes: int
    text_on_host: bool
    load_s: float
    tier: str = "exact"
    read_s: float = 0.0  # of load_s: weights read (and, fast path, cast on the device)
    cast_move_s: float = 0.0  # of load_s: cast and moved to the device after the read
    compiled: bool = False  # the transformer's blocks are compiled (CUDA)
    sizes: list[Any] = field(default_factory=list)  # the sizes compiled so far, oldest first
    prepare_s: float = 0.0  # quantising and wrapping for compile (not compiling: first use)
    adapters: Any = None  # worker.generate.conditions.adapters.Adapters, once a job named a LoRA
    decoders: dict[bool, Any] = field(default_factory=dict)  # tiled? → decoder over pipe.vae


class ModelCache:
    """``get(folder, dtype, tier)`` → a resident pipeline; LRU under a byte budget."""

    def __init__(
        self, device: torch.device, budget_bytes: int, offload_text_encoder: bool = False,
        graphs: int = 0, compiled_sizes: int = 0, load_method: str = "fast",
        load_threads: int = 8, compile_cpu: bool = False,
    ) -> None:
        """``compiled_sizes``: sizes each resident's transformer keeps compiled (CUDA, or the
        CPU with ``compile_cpu``: inductor's C++ backend; 0: the transformer always runs
        eager). ``load_method``: ``fast``
        (``worker.generate.model.fastload``) or ``diffusers`` (``from_pretrained``, then moved)."""
        self.device = device
        self.load_method = load_method
        self.load_threads = load_threads
        self.budget_bytes = budget_bytes
        self.offload_text_encoder = offload_text_encoder
        self.graphs = graphs
        self.compiled_sizes = compiled_sizes if device.type == "cuda" or compile_cpu else 0
        if self.compiled_sizes:
            allow_recompiles(self.compiled_sizes)
        self._entries: OrderedDict[Key, Resident] = OrderedDict()
        self._lock = threading.Lock()

    def resolve_dtype(self, name: str) -> torch.dtype:
        if name == "auto":
            return torch.bfloat16 if self.device.type == "cuda" else torch.float32
        return DTYPES[name]

    @property
    def resident_bytes(self) -> int:
        return sum(e.bytes for e in self._entries.values())

    def keys(self) -> list[Key]:
        """(folder, dtype, tier) of the residents, least recently used first."""
        return list(self._entries)

    def get(self, folder: Path, dtype: torch.dtype, tier: str = "exact",
            pipeline: str = "WanPipeline",
            on_ready: Callable[[str, Any], None] | None = None) -> Resident:
        """The resident at ``tier``, loaded on a miss. ``on_ready(name, model)``: called with
        each model of the pipeline once its weights are on the device, while the others may
        still be read (the fast path; ``diffusers``: all at once, after the load); not for a
        resident already there."""
        key = (str(folder), dtype, tier)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                return entry
            entry = self._load(folder, dtype, pipeline, on_ready)
            self._prepare(entry, tier)
            self._admit(key, entry)
            return entry

    def adopt(self, folder: Path, pipe: Any, tier: str = "exact") -> Resident:
        """Make an already built pipeline the resident model of ``folder`` at ``tier``
        (benchmarks build random-weight pipelines on the GPU and write only their configs to
        ``folder``). The pipeline's transformers are quantised and compiled in place."""
        dtype = pipe.transformer.dtype if pipe.transformer is not None else torch.float32
        loader.adopted(folder)
        entry = self._resident(pipe, folder, dtype, 0.0)
        self._prepare(entry, tier)
        with self._lock:
            self._admit((str(folder), dtype, tier), entry)
        return entry

    def _prepare(self, entry: Resident, tier: str) -> None:
        t0 = time.perf_counter()
        entry.tier = tier
        entry.compiled = prepare(entry.pipe, tier, compile=self.compiled_sizes > 0)
        entry.prepare_s = time.perf_counter() - t0
        if tier != "exact":  # quantised: charge what the device holds now
            entry.bytes = self._charge(entry.pipe, entry.text_on_host)

    def evict_others(self, keep: Resident) -> None:
        """Drop every model but ``keep``: the smaller working set after an out-of-memory."""
        with self._lock:
            for key in [k for k, e in self._entries.items() if e is not keep]:
                del self._entries[key]
        self._release()

    def _admit(self, key: Key, entry: Resident) -> None:
        if entry.bytes > self.budget_bytes:
            raise InvalidJobError(
                f"generate.model: {entry.folder} needs {entry.bytes / 2**30:.1f} GiB, over the "
                f"model cache budget of {self.budget_bytes / 2**30:.1f} GiB "
                "(FRAMEFLEET_MODEL_CACHE_GIB)"
            )
        self._entries[key] = entry
        evicted = False
        while self.resident_bytes > self.budget_bytes:
            old_key, old = self._entries.popitem(last=False)
            log.info("model cache: evicted %s (%.1f GiB)", old_key[0], old.bytes / 2**30)
            evicted = True
        if evicted:
            self._release()

    def _release(self) -> None:
        gc.collect()
        if self.device.type == "cuda" and torch.cuda.is_initialized():
            torch.cuda.empty_cache()

    def _load(self, folder: Path, dtype: torch.dtype, pipeline: str,
              on_ready: Callable[[str, Any], None] | None = None) -> Resident:
        import diffusers
        from safetensors import SafetensorError

        from worker import quiet

        quiet.progress_bars_off()  # one log line per load (below), not one per bar tick
        t0 = time.perf_counter()
        recheck(folder)  # what from_pretrained opens is what was checked, just now
        fast = self.load_method == "fast"
        try:
            if fast:
                # the text encoder read straight to where it lives between jobs
                host = ("text_encoder",) if self._text_on_host else ()
                pipe, times = fastload.load_pipeline(folder, pipeline, dtype, self.device,
                                                     self.load_threads, on_host=host,
                                                     on_ready=on_ready)
            else:
                pipe = getattr(diffusers, pipeline).from_pretrained(
                    str(folder), **quiet.dtype_kwargs(dtype), use_safetensors=True,
                    local_files_only=True)
        except (torch.OutOfMemoryError, InvalidJobError):
            raise  # the job's out-of-memory handling, or a refusal that names its file
        except (OSError, ValueError, KeyError, TypeError, RuntimeError, SafetensorError) as e:
            raise InvalidJobError(f"generate.model: cannot load {folder}: "
                                  f"{str(e)[:300]}") from e
        read_s = time.perf_counter() - t0
        entry = self._resident(pipe, folder, dtype, read_s)
        entry.load_s = time.perf_counter() - t0
        entry.read_s = read_s if not fast else times.ready_s
        entry.cast_move_s = entry.load_s - entry.read_s
        if not fast and on_ready is not None:  # from_pretrained gave them all at once
            for name in fastload.MODELS:
                if getattr(pipe, name, None) is not None:
                    on_ready(name, getattr(pipe, name))
        return entry

    def _resident(self, pipe: Any, folder: Path, dtype: torch.dtype, load_s: float) -> Resident:
        pipe.set_progress_bar_config(disable=True)
        for module in device_modules(pipe):
            module.to(self.device)
        host = self._text_on_host
        pipe.text_encoder.to("cpu" if host else self.device)
        size = self._charge(pipe, host)
        log.info("model cache: %s resident (%.1f GiB on %s, text encoder on %s), read in "
                 "%.1f s",
                 folder, size / 2**30, self.device, "cpu" if host else self.device, load_s)
        return Resident(pipe, folder, dtype, size, host, load_s)

    @property
    def _text_on_host(self) -> bool:
        return self.offload_text_encoder and self.device.type == "cuda"

    @staticmethod
    def _charge(pipe: Any, text_on_host: bool) -> int:
        size = sum(module_bytes(m) for m in device_modules(pipe))
        return size if text_on_host else size + module_bytes(pipe.text_encoder)

    def decoder(self, entry: Resident, tiled: bool = False) -> Any:
        """The streamed decoder over the pipeline's own VAE (built once per model)."""
        if tiled not in entry.decoders:
            from worker.decoders.wan import WanDecoder

            base = entry.decoders.get(False)
            if base is None:
                base = WanDecoder(entry.pipe.vae, self.device, graphs=self.graphs)
                entry.decoders[False] = base
            if tiled:
                entry.decoders[True] = base.with_tiling()
        return entry.decoders[tiled]
