"""The warm-up model: resident at each warm-up tier and compiled at each warm-up size before
the worker reports ready.

``FRAMEFLEET_WARMUP_MODEL`` is loaded once per tier of ``FRAMEFLEET_WARMUP_TIERS`` and, on
CUDA, denoises one step at each size of ``FRAMEFLEET_WARMUP_GENERATE_SIZES``: that first call
compiles the transformer's blocks for the size (from ``FRAMEFLEET_COMPILE_CACHE_DIR`` when a
worker before this one compiled them), so no job pays it. Each step is timed apart, for the
worker's log and the warm-start benchmark.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from producer.errors import InvalidJobError
from producer.settings import Settings
from producer.wire.spec import GenerateSpec
from worker.generate.denoise.loop import denoise
from worker.generate.model.cache import ModelCache, Resident
from worker.generate.request.folder import ModelInfo, model_folder, read_model
from worker.generate.tier.tiers import check_tier, size_stance, transformers_of

log = logging.getLogger(__name__)


@dataclass
class WarmModel:
    """What the warm-up of one tier took: loading (and quantising), then each size."""

    tier: str
    load_s: float = 0.0
    read_s: float = 0.0  # of load_s: the weights read
    cast_move_s: float = 0.0  # of load_s: cast and moved after the read
    prepare_s: float = 0.0
    sizes: dict[str, float] = field(default_factory=dict)
    error: str | None = None


def parse_video_sizes(text: str) -> list[tuple[int, int, int]]:
    """``"704x1280x121,480x832x81"`` → [(704, 1280, 121), (480, 832, 81)] (H, W, frames)."""
    sizes = []
    for item in filter(None, text.split(",")):
        h, w, f = (int(v) for v in item.split("x"))
        sizes.append((h, w, f))
    return sizes


def compile_size(models: ModelCache, entry: Resident, info: ModelInfo, height: int,
                 width: int, frames: int) -> bool:
    """One denoise step at this size (no guidance, a zero prompt): compiles it. Returns
    whether the transformer ran compiled."""
    gen = GenerateSpec(model=info.path.as_uri(), prompt="warm-up", height=height, width=width,
                       num_frames=frames, num_inference_steps=1, guidance_scale=1.0)
    text_dim = entry.pipe.transformer.config.text_dim
    dtype = entry.pipe.transformer.dtype
    embeds = torch.zeros(1, 512, text_dim, dtype=dtype, device=models.device)
    key = (frames, height, width, info.pipeline)
    with size_stance(entry.sizes, entry.compiled, key, models.compiled_sizes,
                                   transformers=tuple(transformers_of(entry.pipe))) as compiled:
        latents, _ = denoise(entry.pipe, gen, info, embeds, None, lambda *_: None,
                             lambda: False)
    del latents
    if models.device.type == "cuda":
        torch.cuda.synchronize(models.device)
    return compiled


def warm_up(models: ModelCache, settings: Settings) -> list[WarmModel]:
    """Load ``FRAMEFLEET_WARMUP_MODEL`` at each warm-up tier and compile each warm-up size.

    A tier this worker cannot run (fp8 on the CPU) is logged and skipped: the worker still
    serves the others."""
    assert settings.warmup_model is not None
    info = read_model(model_folder(settings.warmup_model))
    done = []
    for tier in settings.warmup_tiers.split(","):
        warm = WarmModel(tier)
        done.append(warm)
        try:
            check_tier(tier, models.device)
        except InvalidJobError as e:
            warm.error = str(e)
            log.error("warm-up model at tier %s skipped: %s", tier, e)
            continue
        t0 = time.perf_counter()
        entry = models.get(info.path, models.resolve_dtype("auto"), tier, info.pipeline)
        warm.load_s, warm.prepare_s = round(time.perf_counter() - t0, 3), entry.prepare_s
        warm.read_s, warm.cast_move_s = entry.read_s, entry.cast_move_s
        if not entry.compiled:
            continue
        for height, width, frames in parse_video_sizes(settings.warmup_generate_sizes):
            t = time.perf_counter()
            compile_size(models, entry, info, height, width, frames)
            warm.sizes[f"{height}x{width}x{frames}"] = round(time.perf_counter() - t, 3)
        log.info("warm-up model %s at tier %s: resident in %.1f s, compiled %s", info.path,
                 tier, warm.load_s, warm.sizes or "no size")
    return done


def describe(done: list[WarmModel]) -> dict[str, Any]:
    """The warm-up's breakdown, as the readiness state records it."""
    return {w.tier: {"load_s": w.load_s, "read_s": round(w.read_s, 3),
                     "cast_move_s": round(w.cast_move_s, 3),
                     "prepare_s": round(w.prepare_s, 3), "sizes": w.sizes,
                     **({"error": w.error} if w.error else {})} for w in done}
