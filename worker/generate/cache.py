"""Generation pipelines kept resident on the worker's GPU, under one memory budget.

A worker process keeps the models it ran last, as it keeps decoders (``DecoderCache`` in
``worker/run/decoders.py`` owns one of these as ``.models``): loading a Wan pipeline takes
seconds to minutes, a job should not pay it. Entries are charged the bytes of their parameters and
buffers on the device; beyond ``budget_bytes`` the least recently used are dropped. A model
alone larger than the budget is refused (a fatal error naming ``generate.model``).

With ``offload_text_encoder`` the text encoder (UMT5-XXL: 5.7 B parameters, 11.4 GB in bf16)
lives on the host between jobs and is charged nothing: a job moves it to the GPU to encode
its prompt and back afterwards (``worker/generate/text.py``). The decoder of a generate job
wraps the pipeline's own VAE, so it costs no second copy.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from producer.errors import InvalidJobError

log = logging.getLogger(__name__)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def module_bytes(module: Any) -> int:
    """Bytes of a module's parameters and buffers."""
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclass
class Resident:
    """One loaded pipeline and what the cache knows about it."""

    pipe: Any
    folder: Path
    dtype: torch.dtype
    bytes: int
    text_on_host: bool
    load_s: float
    decoders: dict[bool, Any] = field(default_factory=dict)  # tiled? → decoder over pipe.vae


class ModelCache:
    """``get(folder, dtype)`` → a resident pipeline; LRU under a byte budget."""

    def __init__(
        self, device: torch.device, budget_bytes: int, offload_text_encoder: bool = False,
        graphs: int = 0,
    ) -> None:
        self.device = device
        self.budget_bytes = budget_bytes
        self.offload_text_encoder = offload_text_encoder
        self.graphs = graphs
        self._entries: OrderedDict[tuple[str, torch.dtype], Resident] = OrderedDict()
        self._lock = threading.Lock()

    def resolve_dtype(self, name: str) -> torch.dtype:
        if name == "auto":
            return torch.bfloat16 if self.device.type == "cuda" else torch.float32
        return DTYPES[name]

    @property
    def resident_bytes(self) -> int:
        return sum(e.bytes for e in self._entries.values())

    def keys(self) -> list[tuple[str, torch.dtype]]:
        return list(self._entries)

    def get(self, folder: Path, dtype: torch.dtype) -> Resident:
        key = (str(folder), dtype)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                return entry
            entry = self._load(folder, dtype)
            self._admit(key, entry)
            return entry

    def adopt(self, folder: Path, pipe: Any) -> Resident:
        """Make an already built pipeline the resident model of ``folder`` (benchmarks build
        random-weight pipelines on the GPU and write only their configs to ``folder``)."""
        dtype = pipe.transformer.dtype if pipe.transformer is not None else torch.float32
        entry = self._resident(pipe, folder, dtype, 0.0)
        with self._lock:
            self._admit((str(folder), dtype), entry)
        return entry

    def evict_others(self, keep: Resident) -> None:
        """Drop every model but ``keep``: the smaller working set after an out-of-memory."""
        with self._lock:
            for key in [k for k, e in self._entries.items() if e is not keep]:
                del self._entries[key]
        self._release()

    def _admit(self, key: tuple[str, torch.dtype], entry: Resident) -> None:
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

    def _load(self, folder: Path, dtype: torch.dtype) -> Resident:
        from diffusers import WanPipeline

        t0 = time.perf_counter()
        try:
            pipe = WanPipeline.from_pretrained(str(folder), torch_dtype=dtype)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise InvalidJobError(f"generate.model: cannot load {folder}: {e}") from e
        return self._resident(pipe, folder, dtype, time.perf_counter() - t0)

    def _resident(self, pipe: Any, folder: Path, dtype: torch.dtype, load_s: float) -> Resident:
        pipe.set_progress_bar_config(disable=True)
        on_device = [pipe.transformer, pipe.transformer_2, pipe.vae]
        for module in on_device:
            if module is not None:
                module.to(self.device)
        host = self.offload_text_encoder and self.device.type == "cuda"
        pipe.text_encoder.to("cpu" if host else self.device)
        size = sum(module_bytes(m) for m in on_device if m is not None)
        if not host:
            size += module_bytes(pipe.text_encoder)
        log.info("model cache: %s resident (%.1f GiB on %s, text encoder on %s) in %.1f s",
                 folder, size / 2**30, self.device, "cpu" if host else self.device, load_s)
        return Resident(pipe, folder, dtype, size, host, load_s)

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
