"""A model's decoder graphs at a warm-up: built, timed, and said to be a hit or a miss.

The decoder of a generate job wraps the pipeline's own VAE (``ModelCache.decoder``); on CUDA
it replays a compiled, captured graph per latent size and one more for a job's first chunk
(``worker.decoders.wan_graph``). Both compile at the warm-up and in ``framefleet compile``, so
both are in the compile artifact: each graph's name, ``steady 48x44x80`` or ``first
48x44x80`` (latent channels x height x width), is listed in the artifact's index entry
(``Entry.graphs``), and a warm-up tells each graph's hit (its compile served from the caches,
inductor's FX graph cache counters: nothing compiled) or miss with the reason, as it does for
the transformer's sizes.

Spans: the seconds a build spent waiting for weights still streaming in (a capture waits for
them: ``wan_capture.loading``) are cut out of its span, so that the start's critical path
charges them to the read, not to the graphs (``worker.lifecycle.startphases``).
"""

from __future__ import annotations

import time
from typing import Any

from worker.generate.model.artifact_index import Entry

#: (phase, start, end): epoch seconds, as ``worker.lifecycle.startphases`` reads them.
Span = tuple[str, float, float]


def latent_sizes(vae: Any, sizes: list[tuple[int, int, int]]) -> list[tuple[int, int]]:
    """The latent (height, width) of each video size, once each, for ``vae``'s spatial
    factor (``scale_factor_spatial``, as diffusers' Wan pipelines read it; 8 without one)."""
    config = getattr(vae, "config", {})
    factor = int(config.get("scale_factor_spatial", 8)) if hasattr(config, "get") else 8
    return list(dict.fromkeys((h // factor, w // factor) for h, w, _ in sizes))


def graph_names(channels: int, latent: tuple[int, int]) -> tuple[str, str]:
    """The steady graph's and the first chunk's graph's names at ``latent``."""
    size = f"{channels}x{latent[0]}x{latent[1]}"
    return f"steady {size}", f"first {size}"


def build(decoder: Any, latents: list[tuple[int, int]], phase: str = "model_decode",
          ) -> tuple[dict[str, dict[str, Any]], list[Span]]:
    """Build ``decoder``'s steady and first-chunk graphs at each latent size, now, in this
    thread (``WanDecoder.warmup(first_now=True)``: a short decode through them follows).
    Returns each graph's outcome (seconds, of which ``wait_s`` waiting for loads, FX graph
    cache counters, ``captured``) and this thread's spans, waits for loads cut out."""
    outcomes: dict[str, dict[str, Any]] = {}
    spans: list[Span] = []
    for latent in latents:
        start = time.time()
        decoder.warmup(*latent, first_now=True)
        waits = []
        graph = decoder.graphs.get(decoder.graph_key(*latent)) if decoder.graphs else None
        steady, first = graph_names(decoder.latent_channels, latent)
        for name, g in ((steady, graph), (first, graph.first if graph is not None else None)):
            outcomes[name] = {"captured": g is not None,
                              "seconds": round(g.build_s, 3) if g is not None else 0.0,
                              "wait_s": round(g.phases.get("wait", 0.0), 3) if g else 0.0,
                              "fxgraph": dict(g.cache) if g is not None else {}}
            if g is not None and g.waited is not None:
                waits.append(g.waited)
        spans += cut(phase, start, time.time(), waits)
    return outcomes, spans


def cut(phase: str, start: float, end: float, waits: list[tuple[float, float]]) -> list[Span]:
    """The span ``[start, end]`` of ``phase`` without the ``waits`` inside it."""
    spans, at = [], start
    for a, b in sorted(waits):
        a, b = max(a, at), min(b, end)
        if b <= a:
            continue
        if a > at:
            spans.append((phase, at, a))
        at = b
    if end > at:
        spans.append((phase, at, end))
    return spans


def judge(outcomes: dict[str, dict[str, Any]], loaded: list[Any], no_artifact: str) -> None:
    """Add each graph's ``result`` (hit: the FX graph cache answered, none missed) and a
    miss's ``reason``: not captured; ``no_artifact`` (the first tier's reason) when no
    artifact was loaded; the artifacts loaded do not list it; or they do, yet it missed."""
    entries: list[Entry] = [x.entry for x in loaded if x.entry is not None]
    covered = {g for e in entries for g in e.graphs}
    for name, outcome in outcomes.items():
        fx = outcome.get("fxgraph") or {}
        hit = outcome["captured"] and fx.get("miss", 0) == 0 and fx.get("hit", 0) > 0
        if hit:
            reason = ""
        elif not outcome["captured"]:
            reason = "error: not captured (the decoder logged why); it runs eager"
        elif not entries:
            reason = no_artifact
        elif name not in covered:
            reason = "graph: not in the artifact"
        else:
            reason = "cache: the artifact covers it, yet the FX graph cache missed"
        outcome.update(result="hit" if hit else "miss", reason=reason)
