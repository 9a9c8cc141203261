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
ready (as ``FRAMEFLEET_WARMUP_GENERATE_SIZES`` does for the warm-up model): with a warm
compile cache that is seconds, cold it is minutes a size.
"""

from __future__ import annotations

import copy
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

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
        if "exact" in tiers:
            decoders.models.adopt(folder, pipe, "exact")
        if spare is not None:
            p = pipe
            pipe8 = WanPipeline(tokenizer=p.tokenizer, text_encoder=p.text_encoder, vae=p.vae,
                                scheduler=p.scheduler, transformer=spare,
                                boundary_ratio=p.config.boundary_ratio,
                                expand_timesteps=p.config.expand_timesteps)
            decoders.models.adopt(folder, pipe8, "fp8")
        _compile_sizes(decoders, preset, folder, tiers, dtype)
        seconds[preset] = round(time.perf_counter() - t0, 2)
        log.info("soak: %s resident at %s in %.1f s (random weights)", preset, tiers,
                 seconds[preset])
    return seconds


def _compile_sizes(decoders: Any, preset: str, folder: Path, tiers: list[str],
                   dtype: torch.dtype) -> None:
    from worker.generate.model.warm import compile_size, parse_video_sizes
    from worker.generate.request.folder import read_model

    sizes = dict(item.split("=", 1) for item in
                 filter(None, os.environ.get("FRAMEFLEET_SOAK_SIZES", "").split(";")))
    info = read_model(folder)
    for tier in tiers:
        entry = decoders.models.get(folder, dtype, tier, info.pipeline)
        for h, w, f in parse_video_sizes(sizes.get(preset, "")):
            t0 = time.perf_counter()
            compile_size(decoders.models, entry, info, h, w, f)
            log.info("soak: %s %s compiled at %dx%dx%d in %.1f s", preset, tier, h, w, f,
                     time.perf_counter() - t0)


def _soak_warm_up(decoders: Any, settings: Any, *args: Any, **kwargs: Any) -> Any:
    adopt_models(decoders, os.environ.get("FRAMEFLEET_SOAK_MODELS", ""))
    return _warm_up(decoders, settings, *args, **kwargs)  # the start's phases and clock


warmup.warm_up = _soak_warm_up  # type: ignore[assignment]

__all__ = ["app"]
