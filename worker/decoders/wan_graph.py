"""Steady-state Wan decode chunks as compiled code replayed from CUDA graphs.

Every chunk after the first has the same shapes at one (batch, latent size, dtype), so its
``WanStep`` is compiled once (``torch.compile``, whole chunk, no graph breaks) and captured
once into a CUDA graph whose static inputs are one latent frame and the causal history. A
replay decodes a chunk with one launch, writes the next history in place, and leaves the frames
in a static output buffer: the "consume before advancing" contract of ``ChunkDecoder.stream``.

The compiled step runs on its own copy of the decoder weights in ``channels_last_3d`` (measured
on an H200 at 720p: 88 ms per chunk against 127 ms contiguous), while the eager step keeps the
contiguous weights (eager channels-last is slower: 272 ms against 188 ms).

Graphs are built at worker warm-up (``prepare``) or, for a size first seen in a job, in a
background thread while that job decodes eagerly (``prepare_later``): a new resolution never
stalls a job on compilation. At most ``capacity`` graphs are kept (least recently used goes);
each holds its own memory pool, about one eager chunk's working set.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from worker.decoders.wan_step import CACHE_T, Caches, WanStep, set_memory_format

log = logging.getLogger(__name__)

#: (batch, latent channels, latent h, latent w, dtype)
Key = tuple[int, int, int, int, torch.dtype]


@dataclass
class ChunkGraph:
    """One captured steady-state chunk: copy a latent frame in, replay, read ``out``."""

    graph: torch.cuda.CUDAGraph
    z: torch.Tensor
    caches: Caches
    out: torch.Tensor
    build_s: float
    #: seconds of the build's parts: ``history`` (the eager first chunk giving the history's
    #: shapes), ``compile`` (first compiled call: tracing, compiling or loading from the
    #: compile cache, cuDNN's algorithm search), ``warm`` (two more calls), ``capture``
    phases: dict[str, float] = field(default_factory=dict)

    def load(self, caches: Caches) -> None:
        """Start from the history the (eager) first chunk left."""
        for static, c in zip(self.caches, caches, strict=True):
            static.copy_(c)

    def step(self, z: torch.Tensor) -> torch.Tensor:
        self.z.copy_(z)
        self.graph.replay()
        return self.out


def steady_caches(step: WanStep, key: Key, device: torch.device,
                  memory_format: torch.memory_format) -> Caches:
    """History tensors of the right shapes for ``key``: one eager first chunk on zeros."""
    b, c, h, w, dtype = key
    z = torch.zeros((b, c, 1, h, w), device=device, dtype=dtype)
    with torch.inference_mode():
        _, caches = step(z.contiguous(memory_format=memory_format))
    assert all(t.shape[2] == CACHE_T for t in caches)
    return caches


class ChunkGraphs:
    """Compiled + captured steady-state chunks of one ``WanStep``, per ``Key``, bounded."""

    def __init__(
        self, step: WanStep, device: torch.device, *, capacity: int = 2, compile: bool = True,
        memory_format: torch.memory_format = torch.contiguous_format,
        options: dict[str, Any] | None = None, fused_history: bool = False,
    ) -> None:
        """``options``: inductor options (``torch.compile(options=...)``); ``fused_history``:
        the compiled code writes the next history into the graph's inputs itself (one pass,
        fused with its producers) instead of a copy after the step."""
        self.step = step
        self.device = device
        self.capacity = capacity
        self.memory_format = memory_format
        self.fused_history = fused_history
        self._fn: Callable[..., Any] = _advance(step) if fused_history else step.__call__
        if compile:
            # Every (size, dtype, decoder) compiled is one more dynamo cache entry on the one
            # WanStep code object, and dynamo keeps entries after their graph is evicted: past
            # its default limit of 8, further sizes would quietly run uncompiled.
            dynamo = torch._dynamo.config
            dynamo.recompile_limit = max(dynamo.recompile_limit, 64)
            # cuDNN times its algorithms once per conv shape (at the warm-up before capture)
            # and the graph keeps the fastest; eager decoding is unaffected in speed (measured).
            torch.backends.cudnn.benchmark = True
            self._fn = torch.compile(self._fn, fullgraph=True, dynamic=False,
                                     options=dict(options or {}) or None)
        self._graphs: OrderedDict[Key, ChunkGraph] = OrderedDict()
        self._failed: set[Key] = set()
        self._pending: set[Key] = set()
        self._builders: list[threading.Thread] = []
        self._lock = threading.Lock()  # guards the dicts and sets above
        self._build_lock = threading.Lock()  # one compile/capture at a time
        self._side: torch.cuda.Stream | None = None  # builds' own stream, made once

    @classmethod
    def for_vae(cls, vae: Any, device: torch.device, *, capacity: int = 2,
                **kwargs: Any) -> ChunkGraphs:
        """Graphs over a channels-last copy of ``vae``'s decoder (post_quant_conv + decoder:
        about 150 MB in bf16 for Wan2.1; the encoder is not copied). ``kwargs``: as
        ``__init__`` plus ``subpixel`` (``WanStep``'s), defaulting to ``TUNING``."""
        opts = {**TUNING, **kwargs}
        step = WanStep(_DecoderWeights(vae), subpixel=bool(opts.pop("subpixel", False)))
        return cls(step, device, capacity=capacity, memory_format=torch.channels_last_3d,
                   **opts)

    def get(self, key: Key) -> ChunkGraph | None:
        with self._lock:
            graph = self._graphs.get(key)
            if graph is not None:
                self._graphs.move_to_end(key)
            return graph

    def prepare(self, key: Key) -> ChunkGraph | None:
        """Compile and capture ``key`` now (blocking); None if it cannot be captured.

        One build at a time (a second caller for the same key waits and gets its graph):
        two captures at once, or a capture while another thread compiles, break each other.
        """
        if self.capacity <= 0:
            return None
        with self._build_lock:
            if key in self._failed:
                return None
            graph = self.get(key)
            if graph is not None:
                return graph
            t0 = time.perf_counter()
            try:
                graph = self._capture(key)
            except Exception:  # a graph is an optimisation: the eager step stays correct
                log.exception("decode graph for %s not captured; this size stays eager", key)
                self._failed.add(key)
                return None
            graph.build_s = time.perf_counter() - t0
            log.info("decode graph for %s built in %.1f s", key, graph.build_s)
            with self._lock:
                self._graphs[key] = graph
                while len(self._graphs) > self.capacity:
                    self._graphs.popitem(last=False)
            return graph

    def prepare_later(self, key: Key) -> threading.Thread | None:
        """``prepare`` in a background thread (once per key); the caller decodes eagerly."""
        with self._lock:
            if self.capacity <= 0 or key in self._pending or key in self._failed \
                    or key in self._graphs:
                return None
            self._pending.add(key)

        def build() -> None:
            try:
                self.prepare(key)
            finally:
                with self._lock:
                    self._pending.discard(key)

        thread = threading.Thread(target=build, name=f"decode-graph-{key[2]}x{key[3]}",
                                  daemon=True)
        thread.start()
        self._builders.append(thread)
        return thread

    def wait(self, timeout: float | None = None) -> None:
        """Until the background builds started so far are done (tests, benchmarks)."""
        for thread in list(self._builders):
            thread.join(timeout)

    def _capture(self, key: Key) -> ChunkGraph:
        # All of it on a stream of its own: a background build must not queue behind (or
        # in front of) the job decoding on the compute stream meanwhile. One stream for every
        # build: the allocator caches freed blocks per stream.
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        side = self._side
        side.wait_stream(torch.cuda.current_stream(self.device))
        b, c, h, w, dtype = key
        phases: dict[str, float] = {}
        t = time.perf_counter()
        with torch.cuda.stream(side):
            caches = steady_caches(self.step, key, self.device, self.memory_format)
            z = torch.zeros((b, c, 1, h, w), device=self.device, dtype=dtype) \
                .contiguous(memory_format=self.memory_format)
        side.synchronize()
        phases["history"], t = time.perf_counter() - t, time.perf_counter()
        with torch.inference_mode(), torch.cuda.stream(side):
            # Compilation, autotuning and cuDNN's algorithm search happen here, outside
            # the capture (none of them may run while capturing).
            for i in range(3):
                self._run(z, caches)
                if i == 0:
                    side.synchronize()
                    phases["compile"], t = time.perf_counter() - t, time.perf_counter()
        side.synchronize()
        phases["warm"], t = time.perf_counter() - t, time.perf_counter()
        graph = torch.cuda.CUDAGraph()
        # thread_local: the job decoding eagerly on another thread meanwhile may allocate
        # (cudaMalloc) without invalidating this capture; the allocator sends only this
        # stream's allocations to the graph's pool.
        with torch.inference_mode(), torch.cuda.graph(graph, stream=side,
                                                      capture_error_mode="thread_local"):
            out = self._run(z, caches)
        side.synchronize()
        phases["capture"] = time.perf_counter() - t
        # The warm-up runs' working set (about one eager chunk) sits cached on the build
        # stream, where the job's compute stream can never reuse it: give it back. The
        # graph's own pool is held by the graph and stays.
        torch.cuda.empty_cache()
        return ChunkGraph(graph, z, caches, out, 0.0, phases)

    def _run(self, z: torch.Tensor, caches: Caches) -> torch.Tensor:
        """One steady chunk that leaves the next history in ``caches``."""
        if self.fused_history:
            out: torch.Tensor = self._fn(z, caches)
            return out
        out, new = self._fn(z, caches)
        for static, fresh in zip(caches, new, strict=True):
            static.copy_(fresh)
        return out


def _advance(step: WanStep) -> Callable[[torch.Tensor, Caches], torch.Tensor]:
    """``step`` that writes the new history into ``caches`` in place and returns the frames:
    compiled, the history is written straight from the kernels that produce it."""

    def advance(z: torch.Tensor, caches: Caches) -> torch.Tensor:
        out, new = step(z, caches)
        for static, fresh in zip(caches, new, strict=True):
            static.copy_(fresh)
        return out

    return advance


#: Settings of the worker's graphs (measured on an H200: bench/results/decode-notes.md): the
#: sub-pixel upsample convs (Wan2.2 at 1280x704: 3.499 → 3.322 s a clip) and the history
#: written by the compiled code (3.322 → 3.306 s).
TUNING: dict[str, Any] = {"subpixel": True, "fused_history": True}


class _DecoderWeights(torch.nn.Module):
    """The decoding half of an ``AutoencoderKLWan``, copied, its conv weights channels-last."""

    def __init__(self, vae: Any) -> None:
        super().__init__()
        self.config = vae.config
        self.post_quant_conv = copy.deepcopy(vae.post_quant_conv)
        self.decoder = copy.deepcopy(vae.decoder)
        self.requires_grad_(False).eval()
        set_memory_format(self, torch.channels_last_3d)
