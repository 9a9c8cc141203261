"""The first chunk of a job as a graph of its own (``wan_graph``'s ``first_chunk``), on the CPU:
what the graph runs, how the decoder hands the history from it to the steady graph, and when
the graph cache builds it, and both built at once beside a load. The capture itself runs in
tests/gpu."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import torch

from worker.decoders.wan import WanDecoder, build_vae
from worker.decoders.wan_capture import (
    advance_fn,
    begin_load,
    end_load,
    first_chunk_fn,
    wait_loads,
)
from worker.decoders.wan_graph import ChunkGraph, ChunkGraphs, _Warmed
from worker.decoders.wan_step import WanStep
from worker.owner import DeviceOwner


def _eager(step: WanStep, z: torch.Tensor) -> torch.Tensor:
    chunks, caches = [], None
    with torch.inference_mode():
        for i in range(z.shape[2]):
            out, caches = step(z[:, :, i : i + 1], caches)
            chunks.append(out)
    return torch.cat(chunks, dim=2)


@pytest.mark.parametrize("preset", ["tiny", "tiny-wan2.2"])
def test_first_chunk_body_traces_as_one_graph_and_leaves_the_history(preset: str) -> None:
    # Given the first chunk as the graph runs it: no history in, the history written into
    # static tensors, traced whole (aot_eager: what inductor compiles, without kernels)
    vae = build_vae(preset, seed=2)
    step = WanStep(vae, subpixel=True)
    z = torch.randn(1, vae.config.z_dim, 3, 3, 5, generator=torch.Generator().manual_seed(4))
    first = torch.compile(first_chunk_fn(step), fullgraph=True, dynamic=False,
                          backend="aot_eager")
    with torch.inference_mode():
        expected, history = step(z[:, :, :1])
        static = [torch.full_like(c, float("nan")) for c in history]
        out = first(z[:, :, :1], static)
        # When the steady chunks continue from the history it left
        rest = [advance_fn(step)(z[:, :, i : i + 1], static) for i in (1, 2)]
    # Then the first frame and every later chunk equal the eager decode exactly
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    torch.testing.assert_close(torch.cat([out, *rest], dim=2), _eager(step, z), rtol=0, atol=0)


class _Replay:
    """Stands in for a CUDA graph on the CPU: ``replay`` runs the captured body eagerly on the
    same static tensors, which is what a replay computes."""

    def __init__(self, body: Callable[[], None]) -> None:
        self.body = body
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        self.body()


def _graph(body: Callable[[torch.Tensor, list[torch.Tensor]], torch.Tensor],
           z: torch.Tensor, caches: list[torch.Tensor], out_like: torch.Tensor) -> ChunkGraph:
    out = torch.empty_like(out_like)
    replay = _Replay(lambda: out.copy_(body(z, caches)))
    return ChunkGraph(graph=replay, z=z, caches=caches, out=out, build_s=0.0)  # type: ignore[arg-type]


def _decoder_with_graphs(preset: str, first: bool) -> tuple[WanDecoder, ChunkGraph]:
    vae = build_vae(preset, seed=5)
    decoder = WanDecoder(vae, "cpu")
    step = WanStep(vae)
    c = vae.config.z_dim
    key = decoder.graph_key(3, 4)
    graphs = ChunkGraphs(step, torch.device("cpu"), compile=False, fused_history=True,
                         first_chunk=first)
    with torch.inference_mode():
        out1, history = step(torch.zeros(1, c, 1, 3, 4))
        out4, _ = step(torch.zeros(1, c, 1, 3, 4), history)
        caches = [torch.full_like(t, float("nan")) for t in history]
        steady = _graph(advance_fn(step), torch.zeros(1, c, 1, 3, 4), caches, out4)
        if first:
            steady.first = _graph(first_chunk_fn(step), torch.zeros(1, c, 1, 3, 4), caches, out1)
    graphs._graphs[key] = steady
    decoder.graphs = graphs
    return decoder, steady


@pytest.mark.parametrize("preset", ["tiny", "tiny-wan2.2"])
@pytest.mark.parametrize("first", [False, True])
def test_stream_hands_the_history_from_the_first_chunk_to_the_steady_graph(
        preset: str, first: bool) -> None:
    # Given a decoder whose size has a steady graph, and a first-chunk graph or not
    decoder, steady = _decoder_with_graphs(preset, first)
    c = decoder.latent_channels
    # When two jobs decode (the second must not see the first's history)
    clips = []
    for seed in (1, 2):
        z = torch.randn(c, 4, 3, 4, generator=torch.Generator().manual_seed(seed))
        clips.append((z, torch.cat([x.clone() for x in decoder.stream(z)], dim=1)))
    # Then each equals the eager decode, and every chunk came from a graph where one exists
    for z, clip in clips:
        torch.testing.assert_close(clip, _eager(decoder.step, z[None])[0], rtol=0, atol=0)  # type: ignore[arg-type]
    assert steady.graph.replays == 2 * 3  # type: ignore[attr-defined]
    if first:
        assert steady.first is not None and steady.first.graph.replays == 2  # type: ignore[attr-defined]


class _RecordingGraphs(ChunkGraphs):
    """The cache's bookkeeping without CUDA: captures are recorded (steady, then first), on a
    device owner of its own."""

    def __init__(self, first_delay: float = 0.0, fail_first: bool = False) -> None:
        super().__init__(WanStep(build_vae("tiny")), torch.device("cpu"), capacity=2,
                         compile=False, first_chunk=True, owner=DeviceOwner())
        self.log: list[tuple[str, object]] = []
        self.first_delay = first_delay
        self.fail_first = fail_first

    def _capture(self, key):  # type: ignore[no-untyped-def]
        assert self.owner.holds()
        self.log.append(("steady", key))
        empty = torch.empty(0)
        return ChunkGraph(graph=None, z=empty, caches=[], out=empty, build_s=0.0)  # type: ignore[arg-type]

    def _capture_first(self, key, steady):  # type: ignore[no-untyped-def]
        assert self.owner.holds()
        self.log.append(("first", key))
        time.sleep(self.first_delay)
        if self.fail_first:
            raise RuntimeError("capture failed")
        return ChunkGraph(graph=None, z=steady.z, caches=steady.caches, out=steady.out,  # type: ignore[arg-type]
                          build_s=0.0)


def _key(h: int) -> tuple[int, int, int, int, torch.dtype]:
    return (1, 16, h, h, torch.bfloat16)


def test_first_chunk_graph_follows_its_steady_graph_as_a_build() -> None:
    graphs = _RecordingGraphs()
    steady = graphs.prepare(_key(4))
    assert graphs.wait(timeout=30)
    assert steady is not None and steady.first is not None
    assert graphs.log == [("steady", _key(4)), ("first", _key(4))]
    graphs.prepare(_key(4))
    graphs.wait(timeout=30)
    assert graphs.log == [("steady", _key(4)), ("first", _key(4))]  # built once


def test_steady_builds_of_a_warm_up_go_before_first_chunk_graphs() -> None:
    # A warm-up of two sizes holds the device as a job: the first-chunk builds it queues wait
    # for its end, so the second steady graph (readiness waits for it) never queues behind one.
    graphs = _RecordingGraphs()
    with graphs.owner.job("warm-up"):
        steady = graphs.prepare(_key(4))
        time.sleep(0.05)  # the warm-up's short decode
        graphs.prepare(_key(6))
        assert steady is not None and steady.first is None  # queued, not built
    graphs.wait(timeout=30)
    assert graphs.log == [("steady", _key(4)), ("steady", _key(6)),
                          ("first", _key(4)), ("first", _key(6))]


def test_failed_first_chunk_graph_stays_eager_and_is_not_retried() -> None:
    graphs = _RecordingGraphs(fail_first=True)
    steady = graphs.prepare(_key(4))
    graphs.wait(timeout=30)
    assert steady is not None and steady.first is None
    graphs.prepare(_key(4))
    graphs.wait(timeout=30)
    assert graphs.log.count(("first", _key(4))) == 1


def test_wait_includes_first_chunk_builds_queued_by_a_background_steady_build() -> None:
    graphs = _RecordingGraphs(first_delay=0.3)
    assert graphs.prepare_later(_key(4))
    graphs.wait(timeout=30)
    graph = graphs.get(_key(4))
    assert graph is not None and graph.first is not None


class _GatedGraphs(ChunkGraphs):
    """Both graphs of a size built now (``prepare(first_now=True)``), without CUDA: the
    compiles and captures are logged, and each capture waits for the loads, as
    ``wan_capture.record`` does."""

    def __init__(self) -> None:
        super().__init__(WanStep(build_vae("tiny")), torch.device("cpu"), capacity=2,
                         compile=False, first_chunk=True, owner=DeviceOwner())
        self.log: list[str] = []

    def _warm_steady(self, key):  # type: ignore[no-untyped-def]
        self.log.append("compile steady")
        return _Warmed(torch.empty(0), [], {"compile": 0.1}, {"hit": 1, "miss": 0})

    def _warm_first(self, key, caches):  # type: ignore[no-untyped-def]
        self.log.append("compile first")
        return _Warmed(torch.empty(0), [], {"compile": 0.1}, {"hit": 1, "miss": 0})

    def _record_steady(self, key, warmed):  # type: ignore[no-untyped-def]
        waited = wait_loads()
        self.log.append("capture steady")
        return ChunkGraph(graph=None, z=warmed.z, caches=[], out=warmed.z, build_s=0.0,  # type: ignore[arg-type]
                          phases=dict(warmed.phases), cache=warmed.cache, waited=waited)

    def _record_first(self, warmed, steady):  # type: ignore[no-untyped-def]
        waited = wait_loads()
        self.log.append("capture first")
        return ChunkGraph(graph=None, z=warmed.z, caches=[], out=warmed.z, build_s=0.0,  # type: ignore[arg-type]
                          phases=dict(warmed.phases), cache=warmed.cache, waited=waited)


def test_both_graphs_compile_beside_a_load_and_capture_after_it() -> None:
    # Given weights streaming to the device in another thread (the worker's start)
    graphs = _GatedGraphs()
    begin_load()
    done = threading.Event()
    built: list[object] = []

    def build() -> None:
        built.append(graphs.prepare(_key(4), first_now=True))
        done.set()

    thread = threading.Thread(target=build)
    thread.start()
    # Then both compile meanwhile, and neither captures while the load is held
    deadline = time.monotonic() + 30
    while len(graphs.log) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert graphs.log == ["compile steady", "compile first"] and not done.is_set()
    # When the load ends, the captures follow, the steady one first, nothing queued
    end_load()
    thread.join(30)
    assert graphs.log == ["compile steady", "compile first", "capture steady",
                          "capture first"]
    (steady,) = built
    assert steady is not None and steady.first is not None  # type: ignore[attr-defined]
    assert steady.waited is not None and steady.waited[1] - steady.waited[0] >= 0.1  # type: ignore[attr-defined]
    assert steady.cache == {"hit": 1, "miss": 0}  # type: ignore[attr-defined]
    assert graphs.owner.drain(1)  # no first-chunk build was queued
