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

The first chunk of a job (no history, one frame out) has other shapes: with ``first_chunk``
it gets a graph of its own, compiled and captured in the background once the steady graph of
its size exists (never delaying a steady build, so never the worker's readiness). It writes the
history straight into the steady graph's inputs and shares that graph's memory pool (the two
are replayed one after the other on one stream, never at once). Until it exists, a job's first
chunk runs eagerly and its history is copied in (``load``).
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

from worker.decoders.wan_capture import (
    ChunkGraph,
    Key,
    advance_fn,
    capture,
    first_chunk_fn,
    static_latent,
    steady_caches,
)
from worker.decoders.wan_step import Caches, WanStep, set_memory_format
from worker.gate import GATE, TRACE

__all__ = ["TUNING", "ChunkGraph", "ChunkGraphs", "Key", "steady_caches"]

log = logging.getLogger(__name__)

class ChunkGraphs:
    """Compiled + captured steady-state chunks of one ``WanStep``, per ``Key``, bounded."""

    def __init__(
        self, step: WanStep, device: torch.device, *, capacity: int = 2, compile: bool = True,
        memory_format: torch.memory_format = torch.contiguous_format,
        options: dict[str, Any] | None = None, fused_history: bool = False,
        first_chunk: bool = False,
    ) -> None:
        """``options``: inductor options (``torch.compile(options=...)``); ``fused_history``:
        the compiled code writes the next history into the graph's inputs itself (one pass,
        fused with its producers) instead of a copy after the step; ``first_chunk``: also
        build each size's first-chunk graph, in the background, once its steady graph exists."""
        self.step = step
        self.device = device
        self.capacity = capacity
        self.memory_format = memory_format
        self.fused_history = fused_history
        self.first_chunk = first_chunk
        self._fn: Callable[..., Any] = advance_fn(step) if fused_history else step.__call__
        self._first_fn: Callable[[torch.Tensor, Caches], torch.Tensor] = first_chunk_fn(step)
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
            self._first_fn = torch.compile(self._first_fn, fullgraph=True, dynamic=False,
                                           options=dict(options or {}) or None)
        self._graphs: OrderedDict[Key, ChunkGraph] = OrderedDict()
        self._failed: set[Key] = set()
        self._pending: set[Key] = set()
        self._first_failed: set[Key] = set()
        self._first_pending: set[Key] = set()
        self._builders: list[threading.Thread] = []
        self._lock = threading.Lock()  # guards the dicts and sets above and the counters
        self._build_lock = threading.Lock()  # one compile/capture at a time
        self._steady_asked = 0  # steady builds waiting for or holding the build lock
        self._steady_done_at = 0.0  # monotonic time the last steady build ended
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
        with self._lock:
            self._steady_asked += 1
        try:
            graph = self._prepare_steady(key)
        finally:
            with self._lock:
                self._steady_asked -= 1
                self._steady_done_at = time.monotonic()
        if graph is not None and self.first_chunk:
            self._first_later(key)
        return graph

    def _prepare_steady(self, key: Key) -> ChunkGraph | None:
        # Parked while waiting: a background build holding the lock may be waiting for this
        # thread to leave the gate to capture.
        with GATE.parked(), TRACE.parked():
            self._build_lock.acquire()
        try:
            return self._prepare_steady_locked(key)
        finally:
            self._build_lock.release()

    def _prepare_steady_locked(self, key: Key) -> ChunkGraph | None:
        if key in self._failed:
            return None
        graph = self.get(key)
        if graph is not None:
            return graph
        t0 = time.perf_counter()
        try:
            with TRACE.capture():  # never while a job runs compiled code (worker.gate)
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

        return self._start(build, f"decode-graph-{key[2]}x{key[3]}")

    def _start(self, target: Callable[[], None], name: str) -> threading.Thread:
        thread = threading.Thread(target=target, name=name, daemon=True)
        with self._lock:  # started under the lock: ``wait`` never sees it not yet alive
            self._builders = [t for t in self._builders if t.is_alive()]
            thread.start()
            self._builders.append(thread)
        return thread

    def wait(self, timeout: float | None = None) -> None:
        """Until every background build is done, first-chunk graphs included (tests,
        benchmarks); ``timeout``: seconds in all."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                alive = [t for t in self._builders if t.is_alive()]
            if not alive:
                return
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            with GATE.parked(), TRACE.parked():  # the build may be waiting for this thread
                alive[0].join(left)

    def _first_later(self, key: Key) -> threading.Thread | None:
        """Build ``key``'s first-chunk graph in the background (once per key)."""
        with self._lock:
            graph = self._graphs.get(key)
            if graph is None or graph.first is not None or key in self._first_pending \
                    or key in self._first_failed:
                return None
            self._first_pending.add(key)

        def build() -> None:
            try:
                self._build_first(key)
            finally:
                with self._lock:
                    self._first_pending.discard(key)

        return self._start(build, f"decode-first-graph-{key[2]}x{key[3]}")

    #: Seconds a first-chunk build waits after the last steady build: a warm-up of several
    #: sizes asks for the next steady graph right after the previous one, and that one must
    #: not queue behind a first-chunk compile (it decides when the worker is ready).
    SETTLE_S = 2.0

    def _build_first(self, key: Key) -> None:
        while True:
            with self._lock:
                wait = self._steady_asked > 0 or \
                    time.monotonic() - self._steady_done_at < self.SETTLE_S
            if wait:
                time.sleep(0.1)
                continue
            with self._build_lock:
                with self._lock:
                    if self._steady_asked > 0:
                        continue  # a steady build asked meanwhile: it goes first
                    graph = self._graphs.get(key)
                if graph is None:  # evicted meanwhile
                    return
                t0 = time.perf_counter()
                try:
                    with TRACE.capture():
                        first = self._capture_first(key, graph)
                except Exception:  # an optimisation: the eager first chunk stays correct
                    log.exception("first-chunk graph for %s not captured; it stays eager", key)
                    with self._lock:
                        self._first_failed.add(key)
                    return
                first.build_s = time.perf_counter() - t0
                log.info("first-chunk graph for %s built in %.1f s", key, first.build_s)
                graph.first = first  # one reference assignment: a job reads it once
                return

    def _capture(self, key: Key) -> ChunkGraph:
        # All of it on a stream of its own: a background build must not queue behind (or
        # in front of) the job decoding on the compute stream meanwhile. One stream for every
        # build: the allocator caches freed blocks per stream.
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        side = self._side
        side.wait_stream(torch.cuda.current_stream(self.device))
        t = time.perf_counter()
        with torch.cuda.stream(side):
            caches = steady_caches(self.step, key, self.device, self.memory_format)
            z = static_latent(key, self.device, self.memory_format)
        side.synchronize()
        history = time.perf_counter() - t
        graph, out, phases = capture(self._run, z, caches, side)
        return ChunkGraph(graph, z, caches, out, 0.0, {"history": history, **phases})

    def _capture_first(self, key: Key, steady: ChunkGraph) -> ChunkGraph:
        """The first chunk at ``key``, captured into ``steady``'s pool, writing its history
        into ``steady.caches``. A job may be replaying ``steady`` meanwhile: the compiled
        calls before the capture write a scratch history (a capture itself runs nothing)."""
        side = self._side
        assert side is not None, "the steady graph's build made the stream"
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            z = static_latent(key, self.device, self.memory_format)
        graph, out, phases = capture(self._first_fn, z, steady.caches, side, scratch=True,
                                     pool=steady.graph.pool())
        return ChunkGraph(graph, z, steady.caches, out, 0.0, phases)

    def _run(self, z: torch.Tensor, caches: Caches) -> torch.Tensor:
        """One steady chunk that leaves the next history in ``caches``."""
        if self.fused_history:
            out: torch.Tensor = self._fn(z, caches)
            return out
        out, new = self._fn(z, caches)
        for static, fresh in zip(caches, new, strict=True):
            static.copy_(fresh)
        return out


#: Settings of the worker's graphs (measured on an H200: bench/results/decode-notes.md): the
#: sub-pixel upsample convs (Wan2.2 at 1280x704: 3.499 → 3.322 s a clip) and the history
#: written by the compiled code (3.322 → 3.306 s).
TUNING: dict[str, Any] = {"subpixel": True, "fused_history": True, "first_chunk": True}


class _DecoderWeights(torch.nn.Module):
    """The decoding half of an ``AutoencoderKLWan``, copied, its conv weights channels-last."""

    def __init__(self, vae: Any) -> None:
        super().__init__()
        self.config = vae.config
        self.post_quant_conv = copy.deepcopy(vae.post_quant_conv)
        self.decoder = copy.deepcopy(vae.decoder)
        self.requires_grad_(False).eval()
        set_memory_format(self, torch.channels_last_3d)
