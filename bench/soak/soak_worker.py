"""The worker app of the GPU soak (``bench/soak/soak.py``): the real worker, with random-weight
models resident from its start.

Celery loads it with ``-A bench.soak.soak_worker``. Everything is the real worker
(``worker.lifecycle.main``: the task, its concerns, the pool process's start, /metrics) except
one step of the pool process's warm-up: before it, the models named by ``FRAMEFLEET_SOAK_MODELS``
are built with seeded random weights directly on the device, their configs written to their
folders, and each made resident at its tiers in the process's model cache, as the benchmarks
do (``ModelCache.adopt``). Jobs then name those folders like any model. Real weights would
change no code path after the load, and no model can be downloaded where the soak runs.

``FRAMEFLEET_SOAK_MODELS``: ``preset=folder:tier,tier;preset=folder:tier`` (presets of
``worker.generate.model.presets``; tiers ``exact`` and ``fp8``). ``FRAMEFLEET_SOAK_SIZES``:
``preset=HxWxF,HxWxF;…``, the sizes each of its tiers is compiled for before the worker is
ready (as ``FRAMEFLEET_WARMUP_GENERATE_SIZES`` does for the warm-up model), with its decoder's
graphs at their latent sizes (CUDA): with a warm compile cache that is seconds, cold it is
minutes a size. A model with no size listed is resident eager (the CPU soak compiles one).

``SOAK_ARTIFACTS``: a folder of the compile artifacts ``soak_prime.py --artifacts`` wrote (a
folder per task): before a model's sizes compile, every artifact of its stamp there is loaded,
as a worker loads its own (``worker.generate.model.artifacts``), and each size and graph is
logged as a hit or a miss (``soak: compiled …``), which the soak's report reads.
"""

from __future__ import annotations

import copy
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

from worker.generate.model.warm import compile_size
from worker.lifecycle import warmup
from worker.lifecycle.main import app

log = logging.getLogger("framefleet.soak")
_warm_up = warmup.warm_up


def parse_models(text: str) -> list[tuple[str, Path, list[str]]]:
    """``preset=folder:tier,tier;…`` → [(preset, folder, tiers)]."""
    models = []
    for item in filter(None, text.split(";")):
        preset, _, rest = item.partition("=")
        folder, _, tiers = rest.rpartition(":")
        models.append((preset, Path(folder), tiers.split(",")))
    return models


def adopt_models(decoders: Any, text: str) -> dict[str, float]:
    """Build and adopt every model of ``text``; seconds per preset and tier."""
    from diffusers import WanPipeline

    from worker.generate.model.presets import build_pipeline, save_configs

    device = decoders.device
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    seconds: dict[str, float] = {}
    text_encoder = None  # one UMT5-XXL for every model: random weights, the same shapes
    for preset, folder, tiers in parse_models(text):
        t0 = time.perf_counter()
        pipe = build_pipeline(preset, device, dtype, seed=0)
        if text_encoder is not None and type(pipe.text_encoder) is type(text_encoder):
            pipe.text_encoder = text_encoder
        text_encoder = pipe.text_encoder
        save_configs(pipe, folder)
        spare = copy.deepcopy(pipe.transformer) if "fp8" in tiers else None
        bound = decoders.models.compiled_sizes
        if not _sizes().get(preset):  # no warm size: eager, as with FRAMEFLEET_COMPILED_SIZES=0
            decoders.models.compiled_sizes = 0
        if "exact" in tiers:
            decoders.models.adopt(folder, pipe, "exact")
        if spare is not None:
            p = pipe
            pipe8 = WanPipeline(tokenizer=p.tokenizer, text_encoder=p.text_encoder, vae=p.vae,
                                scheduler=p.scheduler, transformer=spare,
                                boundary_ratio=p.config.boundary_ratio,
                                expand_timesteps=p.config.expand_timesteps)
            decoders.models.adopt(folder, pipe8, "fp8")
        decoders.models.compiled_sizes = bound
        _compile_sizes(decoders, preset, folder, tiers, dtype)
        seconds[preset] = round(time.perf_counter() - t0, 2)
        log.info("soak: %s resident at %s in %.1f s (random weights)", preset, tiers,
                 seconds[preset])
    return seconds


def _sizes() -> dict[str, str]:
    return dict(item.split("=", 1) for item in
                filter(None, os.environ.get("FRAMEFLEET_SOAK_SIZES", "").split(";")))


def _compile_sizes(decoders: Any, preset: str, folder: Path, tiers: list[str],
                   dtype: torch.dtype) -> None:
    from worker.generate.model import artifacts, graphs
    from worker.generate.model.warm import parse_video_sizes
    from worker.generate.request.folder import read_model

    info = read_model(folder)
    sizes = parse_video_sizes(_sizes().get(preset, ""))
    for tier in tiers:
        if not sizes:
            continue
        entry = decoders.models.get(folder, dtype, tier, info.pipeline)
        found = _load_artifacts(folder, tier, decoders.models.device)
        for h, w, f in sizes:
            t0 = time.perf_counter()
            before = artifacts.graph_counters()
            compile_size(decoders.models, entry, info, h, w, f)
            after = artifacts.graph_counters()
            hit = after["miss"] == before["miss"] and after["hit"] > before["hit"]
            log.info("soak: compiled %s %s %dx%dx%d %s in %.1f s (%d artifacts loaded)", preset,
                     tier, h, w, f, "hit" if hit else "miss", time.perf_counter() - t0, found)
        if decoders.models.device.type == "cuda" and decoders.models.graphs > 0:
            built, _ = graphs.build(decoders.models.decoder(entry),
                                    graphs.latent_sizes(entry.pipe.vae, sizes))
            for name, outcome in built.items():
                fx = outcome["fxgraph"]
                hit = outcome["captured"] and not fx.get("miss") and fx.get("hit", 0) > 0
                log.info("soak: compiled %s %s graph %s %s in %.1f s", preset, tier,
                         name.replace(" ", "-"), "hit" if hit else "miss", outcome["seconds"])


def _load_artifacts(folder: Path, tier: str, device: torch.device) -> int:
    """Every artifact of this model's and tier's stamp under ``SOAK_ARTIFACTS``, loaded;
    how many."""
    from worker.generate.model import artifacts

    root = os.environ.get("SOAK_ARTIFACTS")
    if not root:
        return 0
    stamp = artifacts.stamp_for(folder, tier, device)
    loaded = [artifacts.load([artifacts.Place(str(place))], stamp, 2**31)
              for place in sorted(Path(root).iterdir()) if place.is_dir()]
    return sum(1 for found in loaded if found.entry is not None)


def _soak_warm_up(decoders: Any, settings: Any, *args: Any, **kwargs: Any) -> Any:
    adopt_models(decoders, os.environ.get("FRAMEFLEET_SOAK_MODELS", ""))
    return _warm_up(decoders, settings, *args, **kwargs)  # the start's phases and clock


warmup.warm_up = _soak_warm_up  # type: ignore[assignment]

__all__ = ["app"]
