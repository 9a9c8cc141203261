"""The warm-up model: resident at each warm-up tier, its transformer compiled at each warm-up
size and its decoder's graphs built, before the worker reports ready.

``FRAMEFLEET_WARMUP_MODEL`` is loaded once per tier of ``FRAMEFLEET_WARMUP_TIERS`` and, on
CUDA, denoises one step at each size of ``FRAMEFLEET_WARMUP_GENERATE_SIZES``: that first call
compiles the transformer's blocks for the size (from ``FRAMEFLEET_COMPILE_CACHE_DIR`` when a
worker before this one compiled them), so no job pays it; its decoder's two graphs (steady
chunks and a job's first chunk) are built at each size's latent size
(``worker.generate.model.graphs``).

The steps overlap where they do not depend on each other. The compile artifacts of every tier
are loaded first (``worker.generate.model.artifacts``: the model folder's ``compiled/``, then
``FRAMEFLEET_COMPILE_ARTIFACTS``), before anything compiles. The first tier's weights then
stream to the device in a thread of their own, the VAE's first, and this thread builds the
decoder's graphs as soon as the VAE is there; their captures wait for the last weights
(``wan_capture.loading``), their compiles do not. The transformer's sizes compile once the
weights are in. Each step's span (epoch seconds) is recorded for the start's critical path
(``worker.lifecycle.startphases``).

Each size and graph says whether it was a hit (inductor's FX graph cache answered, nothing
compiled: its counters, not a guess) or a miss and why; with ``FRAMEFLEET_PUBLISH_COMPILED`` a
tier that compiled something no artifact covered publishes its artifact for the next worker.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from producer.errors import FramefleetError, InvalidJobError
from producer.settings import Settings
from producer.wire.spec import GenerateSpec
from worker.generate.denoise.loop import denoise
from worker.generate.model import graphs
from worker.generate.model.cache import ModelCache, Resident
from worker.generate.model.graphs import Span
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
    #: decoder graph (``steady 48x44x80``) → seconds, result, reason, fxgraph, captured
    graphs: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: (phase, start, end), epoch seconds: artifacts, read, cast_move, prepare, model_decode,
    #: compile_cache
    spans: list[Span] = field(default_factory=list)


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
    """Load ``FRAMEFLEET_WARMUP_MODEL`` at each warm-up tier, build its decoder's graphs and
    compile each warm-up size (the module's docstring says in which order).

    A tier this worker cannot run (fp8 on the CPU) is logged and skipped: the worker still
    serves the others."""
    from worker.generate.model import artifacts

    assert settings.warmup_model is not None
    info = read_model(model_folder(settings.warmup_model))
    done = [WarmModel(tier) for tier in settings.warmup_tiers.split(",")]
    runnable = []
    for warm in done:
        try:
            check_tier(warm.tier, models.device)
            runnable.append(warm)
        except InvalidJobError as e:
            warm.error = str(e)
            log.error("warm-up model at tier %s skipped: %s", warm.tier, e)
    if runnable:
        _before_load(models, info, runnable[0])
    artifacts.start_recording()  # what a tier publishes: everything compiled from here on
    loaded = _load_artifacts(models, info, settings, runnable)
    for i, warm in enumerate(runnable):
        entry = _resident(models, info, settings, warm, loaded, overlap=i == 0)
        if entry.compiled:
            compile_tier(models, entry, info, settings, warm, loaded)
            log.info("warm-up model %s at tier %s: resident in %.1f s, compiled %s (%s); "
                     "decoder graphs %s", info.path, warm.tier, warm.load_s,
                     warm.sizes or "no size", _said(warm.cache) or "no artifact",
                     _said(warm.graphs) or "none")
    return done


def _before_load(models: ModelCache, info: ModelInfo, warm: WarmModel) -> None:
    """The model's classes imported (the ``imports`` phase: seconds of diffusers' lazy
    imports, which the read would otherwise hold) while a thread makes the device's context
    (CUDA: its first allocation)."""
    from worker.generate.model.fastload import import_classes

    start = time.time()
    device = None
    if models.device.type == "cuda":
        device = threading.Thread(target=torch.zeros, args=(1,), kwargs={"device": models.device},
                                  name="warm-up-device", daemon=True)
        device.start()
    import_classes(info.path, info.pipeline)
    if device is not None:
        device.join()
    warm.spans.append(("imports", start, time.time()))


def _said(outcomes: dict[str, dict[str, Any]]) -> str:
    return ", ".join(f"{k} {v['result']}" + (f": {v['reason']}" if v.get("reason") else "")
                     for k, v in outcomes.items())


def _load_artifacts(models: ModelCache, info: ModelInfo, settings: Settings,
                    runnable: list[WarmModel]) -> dict[str, Any]:
    """Every runnable tier's artifact, loaded before anything compiles (the decoder's graphs
    of the first tier compile beside its read). tier → ``artifacts.Loaded``."""
    from worker.generate.model import artifacts
    from worker.metrics.start import ARTIFACT_LOAD

    places = artifact_places(info.path, settings)
    limit = settings.compile_artifact_max_mib * 1024**2
    loaded = {}
    for warm in runnable:
        start = time.time()
        stamp = artifacts.stamp_for(info.path, warm.tier, models.device)
        loaded[warm.tier] = found = artifacts.load(places, stamp, limit)
        warm.artifact = {"loaded": found.where, "load_s": round(found.seconds, 3)}
        warm.spans.append(("artifacts", start, time.time()))
        ARTIFACT_LOAD.labels(warm.tier).set(found.seconds)
    return loaded


def _resident(models: ModelCache, info: ModelInfo, settings: Settings, warm: WarmModel,
              loaded: dict[str, Any], overlap: bool) -> Resident:
    """The tier's resident, timed. ``overlap`` (the first tier): read in a thread of its own
    while this one builds the decoder's graphs as soon as the VAE is on the device."""
    start = time.time()
    box: dict[str, Any] = {}
    if overlap:
        entry = _load_beside(models, info, settings, warm, box)
    else:
        entry = models.get(info.path, models.resolve_dtype("auto"), warm.tier, info.pipeline)
    end = time.time()
    warm.load_s = round(end - start, 3)
    warm.read_s, warm.cast_move_s, warm.prepare_s = entry.read_s, entry.cast_move_s, \
        entry.prepare_s
    # The load's own parts, in order, ending where the load ended (its span, from its thread)
    load_start, load_end = box.get("span", (start, end))
    read_end = load_start + entry.read_s
    warm.spans += [("read", load_start, read_end),
                   ("cast_move", read_end, read_end + entry.cast_move_s),
                   ("prepare", load_end - entry.prepare_s, load_end)]
    if "decoder" in box:
        entry.decoders.setdefault(False, box["decoder"])
        _judge_graphs(warm, box["outcomes"], loaded, settings)
        warm.spans += box["spans"]
    return entry


def _load_beside(models: ModelCache, info: ModelInfo, settings: Settings, warm: WarmModel,
                 box: dict[str, Any]) -> Resident:
    """``models.get`` in a thread of its own; this thread builds the VAE's decode graphs
    meanwhile (CUDA, decode graphs on). ``box`` gets the load's span and the graphs'."""
    from worker.decoders.wan_capture import begin_load, end_load

    vae_in = threading.Event()

    def on_ready(name: str, model: Any) -> None:
        if name == "vae":
            box["vae"] = model
            vae_in.set()

    def load() -> None:
        start = time.time()
        try:
            box["entry"] = models.get(info.path, models.resolve_dtype("auto"), warm.tier,
                                      info.pipeline, on_ready=on_ready)
        except BaseException as e:  # noqa: BLE001 - handed to the warm-up's thread below
            box["error"] = e
        finally:
            box["span"] = (start, time.time())
            end_load()  # begun below, before this thread ran: no capture slips in first
            vae_in.set()

    begin_load()
    thread = threading.Thread(target=load, name="warm-up-load", daemon=True)
    thread.start()
    vae_in.wait()
    sizes = parse_video_sizes(settings.warmup_generate_sizes)
    try:
        if "vae" in box and models.device.type == "cuda" and models.graphs > 0 and sizes:
            from worker.decoders.wan import WanDecoder

            decoder = WanDecoder(box["vae"], models.device, graphs=models.graphs)
            box["outcomes"], box["spans"] = graphs.build(
                decoder, graphs.latent_sizes(box["vae"], sizes))
            box["decoder"] = decoder
    finally:  # whatever became of the graphs, the load ends before the warm-up goes on
        thread.join()
    if "error" in box:
        raise box["error"]
    entry: Resident = box["entry"]
    return entry


def _judge_graphs(warm: WarmModel, outcomes: dict[str, dict[str, Any]], loaded: dict[str, Any],
                  settings: Settings) -> None:
    from worker.metrics.start import publish_graphs

    first = loaded.get(warm.tier)
    graphs.judge(outcomes, list(loaded.values()),
                 first.reason if first is not None else "no artifact")
    warm.graphs.update(outcomes)
    publish_graphs(outcomes)
    for name, outcome in outcomes.items():
        if name.startswith("steady "):
            warm.decode[name.split()[1]] = outcome["seconds"]


def compile_tier(models: ModelCache, entry: Resident, info: ModelInfo, settings: Settings,
                 warm: WarmModel, loaded: dict[str, Any]) -> None:
    """Compile each warm-up size (timed, hit or miss by inductor's counters) and, where the
    load did not build them beside it, the decoder's graphs; then publish the tier's artifact
    if asked and something missed."""
    from worker.generate.model import artifacts
    from worker.metrics.start import publish

    found = loaded[warm.tier]
    for height, width, frames in parse_video_sizes(settings.warmup_generate_sizes):
        size = f"{height}x{width}x{frames}"
        before = artifacts.graph_counters()
        t, start = time.perf_counter(), time.time()
        compile_size(models, entry, info, height, width, frames)
        warm.sizes[size] = round(time.perf_counter() - t, 3)
        warm.spans.append(("compile_cache", start, time.time()))
        after = artifacts.graph_counters()
        hit = after["miss"] == before["miss"] and after["hit"] > before["hit"]
        reason = "" if hit else (found.reason if found.entry is None else
                                 "cache: the artifact covers it, yet the FX graph cache missed"
                                 if found.covers(size) else "size: not in the artifact")
        warm.cache[size] = {"result": "hit" if hit else "miss", "reason": reason,
                            "fxgraph": {k: after[k] - before[k] for k in after}}
    start = time.time()
    _encode_once(models, entry, info)
    warm.spans.append(("compile_cache", start, time.time()))
    publish(warm.tier, warm.cache, found.seconds)
    if not warm.graphs:
        warm_decoder(models, entry, warm, loaded, settings)
    missed = [o for o in (*warm.cache.values(), *warm.graphs.values()) if o["result"] == "miss"]
    places = artifact_places(info.path, settings)
    if settings.publish_compiled and missed:
        _publish(places[-1], artifacts.stamp_for(info.path, warm.tier, models.device), warm,
                 found, settings)


def _encode_once(models: ModelCache, entry: Resident, info: ModelInfo) -> None:
    """One prompt encoded, so that a first job's text encoder pays no first-call costs (the
    sizes' steps take zero embeddings); not where the encoder lives on the host between jobs
    (a move of gigabytes each way, which every job pays anyway)."""
    from worker.generate.conditions.text import encode_prompt

    if entry.text_on_host or models.device.type != "cuda":
        return
    gen = GenerateSpec(model=info.path.as_uri(), prompt="warm-up", num_inference_steps=1,
                       guidance_scale=1.0)
    encode_prompt(entry.pipe, gen, models.device, on_host=False)


def _publish(place: Any, stamp: Any, warm: WarmModel, found: Any, settings: Settings) -> None:
    from worker.generate.model import artifacts

    old = found.entry
    sizes = [*warm.cache, *(old.sizes if old is not None else [])]
    built = [k for k, v in warm.graphs.items() if v["captured"]]
    try:
        written = artifacts.save(place, stamp, sizes, settings.compile_artifact_max_mib * 2**20,
                                 [*built, *(old.graphs if old is not None else [])])
    except (FramefleetError, OSError) as e:  # a worker that cannot publish still serves
        log.error("compile artifact of %s not published: %s", warm.tier, e)
        return
    if written is not None:
        warm.artifact["published"] = place.uri(written.file)


def warm_decoder(models: ModelCache, entry: Resident, warm: WarmModel,
                 loaded: dict[str, Any] | None = None, settings: Settings | None = None,
                 ) -> None:
    """(CUDA, decode graphs on) The model's own decoder's graphs at each warm-up size's
    latent size, then one short decode through them: a first job at that size decodes from
    the graphs. Without it, that job decoded eagerly while the graph built beside it, and
    paid cuDNN's algorithm search for each of its conv shapes (``cudnn.benchmark`` is on once
    graphs exist): 14.5 s of decode against 1.3 s of denoise in the GPU soak."""
    if models.device.type != "cuda" or models.graphs <= 0:
        return
    decoder = models.decoder(entry)
    sizes = [parse_size(s) for s in warm.sizes]
    outcomes, spans = graphs.build(decoder, graphs.latent_sizes(entry.pipe.vae, sizes))
    warm.spans += spans
    if settings is not None:
        _judge_graphs(warm, outcomes, loaded or {}, settings)
    else:
        warm.graphs.update(outcomes)


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
                     **({"graphs": w.graphs} if w.graphs else {}),
                     "spans": [[p, round(a, 3), round(b, 3)] for p, a, b in w.spans],
                     **({"error": w.error} if w.error else {})} for w in done}
