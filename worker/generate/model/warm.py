"""The warm-up model: resident at each warm-up tier and compiled at each warm-up size before
the worker reports ready.

``FRAMEFLEET_WARMUP_MODEL`` is loaded once per tier of ``FRAMEFLEET_WARMUP_TIERS`` and, on
CUDA, denoises one step at each size of ``FRAMEFLEET_WARMUP_GENERATE_SIZES``: that first call
compiles the transformer's blocks for the size (from ``FRAMEFLEET_COMPILE_CACHE_DIR`` when a
worker before this one compiled them), so no job pays it. Each step is timed apart, for the
worker's log and the warm-start benchmark.

Before a tier's first compile, the compile artifacts that match it are loaded
(``worker.generate.model.artifacts``: the model folder's ``compiled/``, then
``FRAMEFLEET_COMPILE_ARTIFACTS``). Each size then says whether it was a hit (inductor's FX
graph cache answered, nothing compiled: its counters, not a guess) or a miss and why; with
``FRAMEFLEET_PUBLISH_COMPILED`` a tier that compiled a size no artifact covered publishes its
artifact for the next worker.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from producer.errors import FramefleetError, InvalidJobError
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
    #: size → {"result": "hit" | "miss", "reason": why a miss missed, "fxgraph": inductor's
    #: FX graph cache hits and misses during that size's compile}
    cache: dict[str, dict[str, Any]] = field(default_factory=dict)
    artifact: dict[str, Any] = field(default_factory=dict)  # what was loaded / published
    decode: dict[str, float] = field(default_factory=dict)  # HxW → its decoder's warm-up, s


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
        compile_tier(models, entry, info, settings, warm)
        log.info("warm-up model %s at tier %s: resident in %.1f s, compiled %s (%s)", info.path,
                 tier, warm.load_s, warm.sizes or "no size", ", ".join(
                     f"{k} {v['result']}" + (f": {v['reason']}" if v.get("reason") else "")
                     for k, v in warm.cache.items()) or "no artifact")
    return done


def compile_tier(models: ModelCache, entry: Resident, info: ModelInfo, settings: Settings,
                 warm: WarmModel) -> None:
    """Load the tier's artifact, compile each warm-up size (timed, hit or miss by inductor's
    counters), then publish the tier's artifact if asked and a size missed."""
    from worker.generate.model import artifacts
    from worker.metrics.start import publish

    places = artifact_places(info.path, settings)
    limit = settings.compile_artifact_max_mib * 1024**2
    stamp = artifacts.stamp_for(info.path, warm.tier, models.device)
    artifacts.start_recording()
    loaded = artifacts.load(places, stamp, limit)
    warm.artifact = {"loaded": loaded.where, "load_s": round(loaded.seconds, 3)}
    for height, width, frames in parse_video_sizes(settings.warmup_generate_sizes):
        size = f"{height}x{width}x{frames}"
        before = artifacts.graph_counters()
        t = time.perf_counter()
        compile_size(models, entry, info, height, width, frames)
        warm.sizes[size] = round(time.perf_counter() - t, 3)
        after = artifacts.graph_counters()
        hit = after["miss"] == before["miss"] and after["hit"] > before["hit"]
        reason = "" if hit else (loaded.reason if loaded.entry is None else
                                 "cache: the artifact covers it, yet the FX graph cache missed"
                                 if loaded.covers(size) else "size: not in the artifact")
        warm.cache[size] = {"result": "hit" if hit else "miss", "reason": reason,
                            "fxgraph": {k: after[k] - before[k] for k in after}}
    publish(warm.tier, warm.cache, loaded.seconds)
    warm_decoder(models, entry, warm)
    missed = [s for s, v in warm.cache.items() if v["result"] == "miss"]
    if settings.publish_compiled and missed and places:
        covered = [*warm.cache, *(loaded.entry.sizes if loaded.entry is not None else [])]
        try:
            written = artifacts.save(places[-1], stamp, covered, limit)
        except (FramefleetError, OSError) as e:  # a worker that cannot publish still serves
            log.error("compile artifact of %s not published: %s", warm.tier, e)
            return
        if written is not None:
            warm.artifact["published"] = places[-1].uri(written.file)


def warm_decoder(models: ModelCache, entry: Resident, warm: WarmModel) -> None:
    """(CUDA, decode graphs on) The model's own decoder compiled and captured at each warm-up
    size's latent size, then one short decode through it: a first job at that size decodes
    from the graph. Without it, that job decoded eagerly while the graph built beside it, and
    paid cuDNN's algorithm search for each of its conv shapes (``cudnn.benchmark`` is on once
    graphs exist): 14.5 s of decode against 1.3 s of denoise in the GPU soak."""
    if models.device.type != "cuda" or models.graphs <= 0:
        return
    factor = int(getattr(entry.pipe, "vae_scale_factor_spatial", 8))
    decoder = models.decoder(entry)
    for height, width in dict.fromkeys((h, w) for h, w, _ in map(parse_size, warm.sizes)):
        t = time.perf_counter()
        decoder.warmup(height // factor, width // factor)
        warm.decode[f"{height}x{width}"] = round(time.perf_counter() - t, 3)


def parse_size(text: str) -> tuple[int, int, int]:
    h, w, f = (int(v) for v in text.split("x"))
    return h, w, f


def artifact_places(folder: Path, settings: Settings) -> list[Any]:
    """Where a worker looks for artifacts, in order: the model folder's ``compiled/``, then
    ``FRAMEFLEET_COMPILE_ARTIFACTS`` (the last is where it publishes)."""
    from worker.generate.model.artifacts import Place

    places = [Place(str(folder / "compiled"))]
    if settings.compile_artifacts:
        places.append(Place(settings.compile_artifacts, settings))
    return places


def describe(done: list[WarmModel]) -> dict[str, Any]:
    """The warm-up's breakdown, as the readiness state records it."""
    return {w.tier: {"load_s": w.load_s, "read_s": round(w.read_s, 3),
                     "cast_move_s": round(w.cast_move_s, 3),
                     "prepare_s": round(w.prepare_s, 3), "sizes": w.sizes,
                     **({"cache": w.cache} if w.cache else {}),
                     **({"artifact": w.artifact} if w.artifact else {}),
                     **({"decode": w.decode} if w.decode else {}),
                     **({"error": w.error} if w.error else {})} for w in done}
