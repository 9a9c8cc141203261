"""Steady-state Wan decode chunks as compiled code replayed from CUDA graphs.

Every chunk after the first has the same shapes at one (batch, latent size, dtype), so its
``WanStep`` is compiled once (``torch.compile``, whole chunk, no graph breaks) and captured
once into a CUDA graph whose static inputs are one latent frame and the causal history. A
replay decodes a chunk with one launch, writes the next history in place, and leaves the frames
in a static output buffer: the "consume before advancing" contract of ``ChunkDecoder.stream``.

The compiled step runs on its own copy of the decoder weights in ``channels_last_3d`` (measured
on an H200 at 720p: 88 ms per chunk against 127 ms contiguous), while the eager step keeps the
contiguous weights (eager channels-last is slower: 272 ms against 188 ms).

Graphs are built at worker warm-up (``prepare``, in the job thread) or, for a size first seen in
a job, as a build of the process's device owner (``prepare_later``, ``worker.owner``): that job
decodes eagerly, and the build runs once no job holds the device, so a new resolution never
stalls a job on compilation and a build never runs beside a job. At most ``capacity`` graphs are
kept (least recently used goes); each holds its own memory pool, about one eager chunk's working
set.

The first chunk of a job (no history, one frame out) has other shapes: with ``first_chunk``
it gets a graph of its own, built as the next build once the steady graph of its size exists
(queued behind the steady builds a warm-up asks for in a row, so never delaying the worker's
readiness). It writes the history straight into the steady graph's inputs and shares that
graph's memory pool (the two are replayed one after the other on one stream, never at once).
Until it exists, a job's first chunk runs eagerly and its history is copied in (``load``).
"""

from __future__ import annotations

import copy
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from worker.decoders.wan_capture import (
    ChunkGraph,
    Key,
    advance_fn,
    compile_calls,
    first_chunk_fn,
    record,
    static_latent,
    steady_caches,
)
from worker.decoders.wan_step import Caches, WanStep, set_memory_format
from worker.owner import DEVICE, DeviceOwner

__all__ = ["TUNING", "ChunkGraph", "ChunkGraphs", "Key", "steady_caches"]

log = logging.getLogger(__name__)

class ChunkGraphs:
    """Compiled + captured steady-state chunks of one ``WanStep``, per ``Key``, bounded."""

    def __init__(
        self, step: WanStep, device: torch.device, *, capacity: int = 2, compile: bool = True,
        memory_format: torch.memory_format = torch.contiguous_format,
        options: dict[str, Any] | None = None, fused_history: bool = False,
        first_chunk: bool = False, owner: DeviceOwner | None = None,
    ) -> None:
        """``options``: inductor options (``torch.compile(options=...)``); ``fused_history``:
        the compiled code writes the next history into the graph's inputs itself (one pass,
        fused with its producers) instead of a copy after the step; ``first_chunk``: also
        build each size's first-chunk graph, as a build, once its steady graph exists;
        ``owner``: the device owner builds go through (the process's ``DEVICE``)."""
        self.step = step
        self.device = device
        self.capacity = capacity
        self.memory_format = memory_format
        self.fused_history = fused_history
        self.first_chunk = first_chunk
        self.owner = owner if owner is not None else DEVICE
        self._fn: Callable[..., Any] = advance_fn(step) if fused_history else step.__call__
        self._first_fn: Callable[[torch.Tensor, Caches], torch.Tensor] = first_chunk_fn(step)
        if compile:
            # Every (size, dtype, decoder) compiled is one more dynamo cache entry on the one
            # WanStep code object, and dynamo keeps entries after their graph is evicted: past
            # its default limit of 8, further sizes would quietly run uncompiled.
            dynamo = torch._dynamo.config
            dynamo.recompile_limit = max(dynamo.recompile_limit, 64)
            self._fn = torch.compile(self._fn, fullgraph=True, dynamic=False,
                                     options=dict(options or {}) or None)
            self._first_fn = torch.compile(self._first_fn, fullgraph=True, dynamic=False,
                                           options=dict(options or {}) or None)
        # Read and written only by the thread that holds the device (a job or the builder),
        # one at a time (``worker.owner``): no lock of their own.
        self._graphs: OrderedDict[Key, ChunkGraph] = OrderedDict()
        self._failed: set[Key] = set()
        self._first_failed: set[Key] = set()
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
        graph = self._graphs.get(key)
        if graph is not None:
            self._graphs.move_to_end(key)
        return graph

    def prepare(self, key: Key, first_now: bool = False) -> ChunkGraph | None:
        """Compile and capture ``key`` now, in this thread, holding the device (blocking);
        None if it cannot be captured. Its first-chunk graph is queued as a build, or, with
        ``first_now``, built here too: both compile before either is captured, so that a
        capture that waits for weights still streaming in (``wan_capture.loading``) holds up
        neither compile."""
        if self.capacity <= 0:
            return None
        with self.owner.job("decode graph build"):
            if first_now and self.first_chunk:
                return self._prepare_both(key)
            return self._prepare(key)

    def _prepare_both(self, key: Key) -> ChunkGraph | None:
        graph = self.get(key)
        if graph is not None:  # built before: its first-chunk graph now, if it lacks one
            if graph.first is None:
                self._build_first(key)
            return graph
        if key in self._failed:
            return None
        try:
            with _cudnn_search():
                steady = self._warm_steady(key)
                try:
                    first: _Warmed | None = self._warm_first(key, steady.caches)
                except Exception:  # an optimisation: the eager first chunk stays correct
                    log.exception("first-chunk graph for %s not compiled; it stays eager", key)
                    self._first_failed.add(key)
                    first = None
                graph = self._record_steady(key, steady)
        except Exception:  # a graph is an optimisation: the eager step stays correct
            log.exception("decode graph for %s not captured; this size stays eager", key)
            self._failed.add(key)
            return None
        graph.build_s = sum(graph.phases.values())
        log.info("decode graph for %s built in %.1f s", key, graph.build_s)
        self._keep(key, graph)
        if first is not None:
            self._finish_first(key, graph, first)
        return graph

    def _prepare(self, key: Key) -> ChunkGraph | None:
        """``prepare`` by a thread that holds the device already (a job, or the builder)."""
        graph = self._prepare_steady(key)
        if graph is not None and self.first_chunk and graph.first is None \
                and key not in self._first_failed:
            self.owner.submit(f"decode-first-graph-{self._name(key)}",
                              lambda: self._build_first(key))
        return graph

    def _prepare_steady(self, key: Key) -> ChunkGraph | None:
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
        self._keep(key, graph)
        return graph

    def _keep(self, key: Key, graph: ChunkGraph) -> None:
        self._graphs[key] = graph
        while len(self._graphs) > self.capacity:
            self._graphs.popitem(last=False)

    def prepare_later(self, key: Key) -> bool:
        """Queue ``prepare`` as a build (once per key; the caller decodes eagerly): it runs
        once no job holds the device. False if nothing was queued."""
        if self.capacity <= 0 or key in self._failed or key in self._graphs:
            return False
        return self.owner.submit(f"decode-graph-{self._name(key)}", lambda: self._prepare(key))

    def wait(self, timeout: float | None = None) -> bool:
        """Until every queued build is done, first-chunk graphs included (tests, benchmarks,
        between jobs); ``timeout``: seconds in all. Never call it while holding the device."""
        return self.owner.drain(timeout)

    def _name(self, key: Key) -> str:
        """A build's name: one per graph cache (a process may have several decoders) and key."""
        b, c, h, w, dtype = key
        return f"{id(self):x}-{b}x{c}x{h}x{w}-{str(dtype).removeprefix('torch.')}"

    def _build_first(self, key: Key) -> None:
        graph = self._graphs.get(key)
        if graph is None or graph.first is not None or key in self._first_failed:
            return  # evicted meanwhile, or built already
        t0 = time.perf_counter()
        try:
            first = self._capture_first(key, graph)
        except Exception:  # an optimisation: the eager first chunk stays correct
            log.exception("first-chunk graph for %s not captured; it stays eager", key)
            self._first_failed.add(key)
            return
        first.build_s = time.perf_counter() - t0
        log.info("first-chunk graph for %s built in %.1f s", key, first.build_s)
        graph.first = first

    def _capture(self, key: Key) -> ChunkGraph:
        with _cudnn_search():
            return self._capture_searched(key)

    def _capture_searched(self, key: Key) -> ChunkGraph:
        return self._record_steady(key, self._warm_steady(key))

    def _warm_steady(self, key: Key) -> _Warmed:
        """The steady chunk's history and compiled calls at ``key``, not captured yet."""
        # All of it on a stream of its own, made once: the allocator caches freed blocks per
        # stream, and the build's working set is given back after the capture (``record``).
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
        phases, cache = compile_calls(self._run, z, caches, side)
        return _Warmed(z, caches, {"history": history, **phases}, cache)

    def _record_steady(self, key: Key, warmed: _Warmed) -> ChunkGraph:
        assert self._side is not None
        graph, out, seconds, waited = record(self._run, warmed.z, warmed.caches, self._side)
        return ChunkGraph(graph, warmed.z, warmed.caches, out, 0.0,
                          {**warmed.phases, "wait": waited[1] - waited[0], "capture": seconds},
                          warmed.cache, waited)

    def _capture_first(self, key: Key, steady: ChunkGraph) -> ChunkGraph:
        """The first chunk at ``key``, captured into ``steady``'s pool, writing its history
        into ``steady.caches``. The compiled calls before the capture write a scratch history
        (a capture itself runs nothing): ``steady.caches`` may hold a job's history later."""
        with _cudnn_search():
            return self._record_first(self._warm_first(key, steady.caches), steady)

    def _warm_first(self, key: Key, caches: Caches) -> _Warmed:
        side = self._side
        assert side is not None, "the steady graph's build made the stream"
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            z = static_latent(key, self.device, self.memory_format)
        phases, cache = compile_calls(self._first_fn, z, caches, side, scratch=True)
        return _Warmed(z, caches, phases, cache)

    def _record_first(self, warmed: _Warmed, steady: ChunkGraph) -> ChunkGraph:
        assert self._side is not None
        graph, out, seconds, waited = record(self._first_fn, warmed.z, steady.caches,
                                             self._side, pool=steady.graph.pool())
        return ChunkGraph(graph, warmed.z, steady.caches, out, 0.0,
                          {**warmed.phases, "wait": waited[1] - waited[0], "capture": seconds},
                          warmed.cache, waited)

    def _finish_first(self, key: Key, steady: ChunkGraph, warmed: _Warmed) -> None:
        """Capture the first-chunk graph compiled beside ``steady``'s (``_prepare_both``)."""
        try:
            with _cudnn_search():
                first = self._record_first(warmed, steady)
        except Exception:  # an optimisation: the eager first chunk stays correct
            log.exception("first-chunk graph for %s not captured; it stays eager", key)
            self._first_failed.add(key)
            return
        first.build_s = sum(first.phases.values())
        log.info("first-chunk graph for %s built in %.1f s", key, first.build_s)
        steady.first = first

    def _run(self, z: torch.Tensor, caches: Caches) -> torch.Tensor:
        """One steady chunk that leaves the next history in ``caches``."""
        if self.fused_history:
            out: torch.Tensor = self._fn(z, caches)
            return out
        out, new = self._fn(z, caches)
        for static, fresh in zip(caches, new, strict=True):
            static.copy_(fresh)
        return out


@dataclass
class _Warmed:
    """A graph compiled and called, not captured yet: its static input and history, the
    seconds so far and the compile's FX cache counters."""

    z: torch.Tensor
    caches: Caches
    phases: dict[str, float]
    cache: dict[str, int]


@contextmanager
def _cudnn_search() -> Iterator[None]:
    """cuDNN times its algorithms for each conv shape met in the block (the calls before a
    capture) and the graph keeps the fastest. Only in a build: switched on for the whole
    process, it made a job's eager decode at a size new to the process search at every conv
    shape (seconds per clip), for no steady-state gain (eager speed measured the same). A
    build never overlaps a job (``worker.owner``), so no job sees the flag on."""
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = before


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
