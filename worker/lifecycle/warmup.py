"""Worker warm-up and readiness: compile once per fleet, not once per start.

Compiling and capturing one decode size costs 25–30 s on an H200 (inductor lowering, Triton
kernel builds, autotuning). ``use_compile_cache`` points torch.compile's on-disk caches (the FX
graph cache, the AOTAutograd cache, Triton's kernel cache and the autotuning results) at
``FRAMEFLEET_COMPILE_CACHE_DIR``, a folder kept across restarts (a named volume in compose,
instance storage on AWS), so a restarted worker only traces its graphs again and loads the rest.

``warm_up`` builds the warm-up decoder and captures every warm-up size before the worker takes
a job, and publishes readiness twice: the ``framefleet_worker_ready`` gauge and a small state
file per worker process (``producer.state.readiness``) that ``framefleet healthcheck`` reads.

No torch at import time: the healthcheck imports this module.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from producer.state.readiness import WarmupState, process_start_time, state_dir, write_state

if TYPE_CHECKING:
    from producer.settings import Settings
    from worker.run import DecoderCache

log = logging.getLogger(__name__)

#: How long the start waits for the builds its warm-up queued (the first-chunk decode graphs:
#: 22 s each on an H200 with a cold compile cache, 3.4 s warm) before it reports ready anyway,
#: naming what still runs: a first job then waits for that build, where it would otherwise
#: have waited for it unannounced (30.1 s against 5.6 s for the 5B's first job, measured).
BUILDS_TIMEOUT_S = 600.0


def use_compile_cache(folder: str | None) -> str | None:
    """Point torch.compile's on-disk caches into ``folder`` (created); call before the first
    compile. None leaves PyTorch's defaults (a per-user temp folder, lost with the container)."""
    if folder is None:
        return None
    root = Path(folder).expanduser()
    (root / "inductor").mkdir(parents=True, exist_ok=True)
    (root / "triton").mkdir(parents=True, exist_ok=True)
    # Set, not setdefault: torch writes its default into the environment on first use.
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(root / "inductor")
    os.environ["TRITON_CACHE_DIR"] = str(root / "triton")
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "1")
    return str(root)


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """``"44x80,60x104"`` → [(44, 80), (60, 104)] (latent height × width)."""
    sizes = []
    for item in text.split(","):
        h, w = (int(v) for v in item.split("x"))
        sizes.append((h, w))
    return sizes


def _warm_model(decoders: DecoderCache, settings: Settings) -> dict[str, Any]:
    """``FRAMEFLEET_WARMUP_MODEL`` resident at its tiers and compiled at its sizes
    (``worker.generate.model.warm``). A bad folder fails the jobs that name it, not the worker."""
    from producer.errors import FramefleetError
    from worker.generate.model.warm import describe, warm_up

    try:
        return describe(warm_up(decoders.models, settings))
    except FramefleetError as e:
        log.error("FRAMEFLEET_WARMUP_MODEL not loaded: %s", e)
        return {"error": str(e)}


def warm_up(decoders: DecoderCache, settings: Settings,
            phases: dict[str, float] | None = None, started: float | None = None,
            node: str | None = None, readahead: Any = None) -> WarmupState:
    """Load and compile ``FRAMEFLEET_WARMUP_MODEL`` (``worker.generate.model.warm``), build and warm
    up ``FRAMEFLEET_WARMUP_DECODER`` at every warm-up size, then report ready. Without either
    the worker is ready at once. A size whose graph could not be captured (logged by the graph
    cache) stays eager: ready, its entry says ``graph: false``. Holds the process's capture
    device as a job (``worker.owner``): a build it queued runs after it; the start waits for
    them (the ``builds`` phase, at most :data:`BUILDS_TIMEOUT_S`) before it reports ready, so a
    first job does not wait for them unannounced.

    The start's phases (``worker.lifecycle.startphases``: ``phases`` holds ``imports`` and
    ``init``, the seconds before the warm-up, in that order from ``started``, the process
    start, epoch seconds; ``readahead``: this process's ``worker.lifecycle.readahead``, if
    it started one) and its critical path are published before ready; ``node`` (the Celery
    node name) goes in the state for ``framefleet fleet``.
    """
    from worker import metrics
    from worker.owner import DEVICE

    spans = _before(phases or {}, started)
    with DEVICE.job("warm-up"):
        state = _warm_up(decoders, settings, spans, node)
    t = time.time()
    _wait_builds(DEVICE)
    spans.append(("builds", t, time.time()))
    if readahead is not None and (done := readahead.join(BUILDS_TIMEOUT_S)) is not None:
        spans.append(("readahead", *done))
    _publish_phases(state, spans, started)
    state.ready = True
    write_state(state_dir(settings), state)
    metrics.WORKER_READY.set(1)
    return state


def _before(phases: dict[str, float], started: float | None) -> list[tuple[str, float, float]]:
    """The spans of the phases before the warm-up (``imports``, ``init``), one after the
    other from ``started`` (or ending now, without it)."""
    at = started if started is not None else time.time() - sum(phases.values())
    spans = []
    for name, seconds in phases.items():
        spans.append((name, at, at + seconds))
        at += seconds
    return spans


def _wait_builds(owner: Any) -> float:
    """Seconds spent waiting for the builds the warm-up queued; none where the caller holds
    the device (they could not run meanwhile)."""
    if owner.holds():
        return 0.0
    t = time.perf_counter()
    if not owner.drain(BUILDS_TIMEOUT_S):
        log.warning("ready with the warm-up's builds still running after %.0f s: %s",
                    BUILDS_TIMEOUT_S, owner.describe())
    return time.perf_counter() - t


def _publish_phases(state: WarmupState, spans: list[tuple[str, float, float]],
                    started: float | None) -> None:
    """Each phase's own seconds and, from the process start, the critical path, in the state
    and the start's series."""
    from worker import metrics
    from worker.lifecycle.startphases import critical, model_spans, own

    spans = spans + model_spans(state.model)
    phases = own(spans)
    end = time.time()
    start = started if started is not None else min((a for _, a, _ in spans), default=end)
    path = {k: round(v, 3) for k, v in critical(spans, start, end).items()}
    phases["other"] = path.get("other", 0.0)
    phases["total"] = end - start
    state.phases = {k: round(v, 3) for k, v in phases.items()}
    state.critical = path
    metrics.publish_start(state.phases, state.critical)


def _warm_up(decoders: DecoderCache, settings: Settings,
             spans: list[tuple[str, float, float]], node: str | None) -> WarmupState:
    """The warm-up itself, holding the device; returns the state (not ready yet) and adds the
    warm-up decoder's span (``warmup``) to ``spans``."""
    from producer.client.connection import address
    from producer.wire.spec import RANDOM_WEIGHTS, DecoderSpec
    from producer.wire.weights import needs_weights
    from worker import metrics

    metrics.WORKER_READY.set(0)
    pid = os.getpid()
    state = WarmupState(pid=pid, start=process_start_time(pid) or "", node=node,
                        broker=address(settings.broker_url),
                        decoder=settings.warmup_decoder,
                        cache_dir=use_compile_cache(settings.compile_cache_dir))
    folder = state_dir(settings)
    write_state(folder, state)
    t0 = time.perf_counter()
    if settings.warmup_model is not None:
        state.model = _warm_model(decoders, settings)
    if settings.warmup_decoder is not None:
        start = time.time()
        # The jobs' own weights: a job naming the same folder gets this very decoder (and its
        # captured graphs) from the cache instead of building a second one.
        # Unset: random weights, by name (they compile the same kernels; a job naming other
        # weights then builds its own decoder, whose graph builds in the background).
        weights = settings.warmup_weights
        if weights is None and needs_weights(settings.warmup_decoder):
            weights = RANDOM_WEIGHTS
        decoder = decoders.get(DecoderSpec(name=settings.warmup_decoder, weights=weights))
        state.build_s = round(time.perf_counter() - t0, 3)
        for h, w in parse_sizes(settings.warmup_latent_size):
            t = time.perf_counter()
            # Both graphs now (the first chunk's too): ready means a first job at this size
            # replays graphs from its first chunk, with no build queued behind the ready line.
            _warm_decoder_size(decoder, h, w)
            graphs = getattr(decoder, "graphs", None)
            key = getattr(decoder, "graph_key", None)
            graph = graphs.get(key(h, w)) if graphs is not None and key is not None else None
            captured = graph is not None
            state.sizes.append({"size": f"{h}x{w}", "graph": captured,
                                "seconds": round(time.perf_counter() - t, 3),
                                "phases": {k: round(v, 3) for k, v in
                                           getattr(graph, "phases", {}).items()}})
            log.info("warmed up %s at %dx%d latents in %.1f s (graph: %s)", decoder.name, h, w,
                     time.perf_counter() - t, captured)
        spans.append(("warmup", start, time.time()))
    state.seconds = round(time.perf_counter() - t0, 3)
    return state


def _warm_decoder_size(decoder: Any, h: int, w: int) -> None:
    """``decoder.warmup`` with both graphs built now where it has them (the Wan decoders; the
    test pattern has none)."""
    import inspect

    if "first_now" in inspect.signature(decoder.warmup).parameters:
        decoder.warmup(h, w, first_now=True)
    else:
        decoder.warmup(h, w)
