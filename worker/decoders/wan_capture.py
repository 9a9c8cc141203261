"""Capturing one Wan decode chunk as a CUDA graph: the graph record, its static inputs and the
compiled functions a capture replays (see ``wan_graph`` for when graphs are built and kept).

Stream assumptions: everything here runs on the builds' own ``side`` stream; the compiled
calls before a capture (compilation, autotuning and cuDNN's algorithm search, none of which may
run while capturing) execute there, and the capture records kernels without running them. The
builds run only while no job holds the device (``worker.owner``), and a capture waits until no
model's weights stream to the device (``loading``: the start reads its model beside the warm-up's
graph builds): nothing else in the process works on the device during a capture, whose
synchronisations it would break.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from worker.decoders.wan_step import CACHE_T, Caches, WanStep

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
    #: compile cache, cuDNN's algorithm search), ``warm`` (two more calls), ``wait`` (for the
    #: weights streaming to the device meanwhile: ``loading``), ``capture``
    phases: dict[str, float] = field(default_factory=dict)
    #: inductor's FX graph cache over the compile: ``{"hit": n, "miss": m}`` (no miss: served
    #: from the caches, nothing compiled)
    cache: dict[str, int] = field(default_factory=dict)
    #: when the build waited for loads (epoch seconds, start and end), if it did
    waited: tuple[float, float] | None = None
    #: The job's first chunk as a graph of its own (None until built): it leaves the history
    #: in ``caches`` itself, so ``load`` is not needed after it.
    first: ChunkGraph | None = None

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


def static_latent(key: Key, device: torch.device,
                  memory_format: torch.memory_format) -> torch.Tensor:
    """A graph's static input: one latent frame at ``key``, zeros."""
    b, c, h, w, dtype = key
    return torch.zeros((b, c, 1, h, w), device=device, dtype=dtype) \
        .contiguous(memory_format=memory_format)


def fx_counters() -> dict[str, int]:
    """Inductor's FX graph cache counters of this process (hits, misses): whether a compile
    was served from the caches (an artifact's, or the compile cache's) or compiled."""
    from torch._dynamo.utils import counters

    inductor = counters["inductor"]
    return {"hit": int(inductor.get("fxgraph_cache_hit", 0)),
            "miss": int(inductor.get("fxgraph_cache_miss", 0))}


_loads = 0
_loads_done = threading.Condition()


def begin_load() -> None:
    """A load of weights to the device begins (see ``loading``); ``end_load`` ends it, from
    this thread or another (the start begins a load before the thread that does it runs)."""
    global _loads
    with _loads_done:
        _loads += 1


def end_load() -> None:
    global _loads
    with _loads_done:
        _loads -= 1
        _loads_done.notify_all()


@contextmanager
def loading() -> Iterator[None]:
    """Held while weights stream to the device from other threads (a model's load beside the
    warm-up's graph builds): a capture waits until none is held. A capture records what its
    thread queues, and copies and allocations of other threads are allowed beside it
    (``thread_local``), but a device-wide synchronisation or an out-of-memory retry in a
    loading thread would break it; the builds' compiles and calls do not wait."""
    begin_load()
    try:
        yield
    finally:
        end_load()


def wait_loads() -> tuple[float, float]:
    """Until no load is held (see ``loading``); the wait's start and end (epoch seconds)."""
    start = time.time()
    with _loads_done:
        while _loads:
            _loads_done.wait()
    return start, time.time()


def compile_calls(
    run: Callable[[torch.Tensor, Caches], torch.Tensor], z: torch.Tensor, caches: Caches,
    side: torch.cuda.Stream, *, scratch: bool = False,
) -> tuple[dict[str, float], dict[str, int]]:
    """Three calls of ``run(z, caches)`` on ``side`` (the first compiles): the seconds of
    ``compile`` and ``warm``, and the FX graph cache's hits and misses over the compile.

    ``scratch``: the calls write a history of the same layout as ``caches`` instead
    (``caches`` belong to a graph a job may be replaying)."""
    phases: dict[str, float] = {}
    before = fx_counters()
    t = time.perf_counter()
    with torch.inference_mode(), torch.cuda.stream(side):
        # Same sizes, strides and inference-ness as ``caches``: the guards that the compiled
        # code checks at the capture pass without compiling again.
        warm = [torch.empty_strided(c.size(), c.stride(), dtype=c.dtype, device=c.device)
                for c in caches] if scratch else caches
        for i in range(3):
            run(z, warm)
            if i == 0:
                side.synchronize()
                phases["compile"], t = time.perf_counter() - t, time.perf_counter()
    side.synchronize()
    phases["warm"] = time.perf_counter() - t
    after = fx_counters()
    return phases, {k: after[k] - before[k] for k in after}


def record(
    run: Callable[[torch.Tensor, Caches], torch.Tensor], z: torch.Tensor, caches: Caches,
    side: torch.cuda.Stream, *, pool: Any = None,
) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, float, tuple[float, float]]:
    """Capture ``run(z, caches)`` (compiled and called already: ``compile_calls``) once no
    load is held: the graph, its output, the capture's seconds and the wait for the loads.
    ``pool``: the memory pool to capture into (another graph's, replayed one after the other
    with this one, never at once)."""
    waited = wait_loads()
    t = time.perf_counter()
    graph = torch.cuda.CUDAGraph()
    # The caller owns the device (``worker.owner``): no other thread works on it while the
    # capture is open. thread_local: calls that stay allowed meanwhile (a writer's event
    # wait, a cudaMalloc elsewhere) do not invalidate it; the allocator sends only this
    # stream's allocations to the graph's pool.
    with torch.inference_mode(), torch.cuda.graph(
            graph, pool=pool, stream=side, capture_error_mode="thread_local"):
        out = run(z, caches)
    side.synchronize()
    seconds = time.perf_counter() - t
    # The calls' working set (about one eager chunk) sits cached on the build stream, where
    # the job's compute stream can never reuse it: give it back. The graph's own pool is held
    # by the graph and stays.
    torch.cuda.empty_cache()
    return graph, out, seconds, waited


def capture(
    run: Callable[[torch.Tensor, Caches], torch.Tensor], z: torch.Tensor, caches: Caches,
    side: torch.cuda.Stream, *, scratch: bool = False, pool: Any = None,
) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, dict[str, float], dict[str, int]]:
    """``compile_calls`` then ``record``: the graph, its output, the seconds of ``compile``,
    ``warm``, ``wait`` (for the loads) and ``capture``, and the compile's FX cache counters."""
    phases, cache = compile_calls(run, z, caches, side, scratch=scratch)
    graph, out, seconds, (start, end) = record(run, z, caches, side, pool=pool)
    return graph, out, {**phases, "wait": end - start, "capture": seconds}, cache


def advance_fn(step: WanStep) -> Callable[[torch.Tensor, Caches], torch.Tensor]:
    """``step`` that writes the new history into ``caches`` in place and returns the frames:
    compiled, the history is written straight from the kernels that produce it."""

    def advance(z: torch.Tensor, caches: Caches) -> torch.Tensor:
        out, new = step(z, caches)
        for static, fresh in zip(caches, new, strict=True):
            static.copy_(fresh)
        return out

    return advance


def first_chunk_fn(step: WanStep) -> Callable[[torch.Tensor, Caches], torch.Tensor]:
    """A job's first chunk (no history) that writes the history it leaves into ``caches``
    in place and returns the frame: what the first-chunk graph captures."""

    def first(z: torch.Tensor, caches: Caches) -> torch.Tensor:
        out, new = step(z)
        for static, fresh in zip(caches, new, strict=True):
            static.copy_(fresh)
        return out

    return first
