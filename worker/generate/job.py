"""A generate job's first stages, in the order of ``worker/generate/``'s rooms: check the request
(``request``), find or load the model (``model``), read its images and LoRAs and encode the
prompt (``conditions``), denoise under the job's tier and step cache (``tier``, ``denoise``),
hand the latents off (``handoff``).

Called by the runner in place of loading latents; the returned latents stay on the device and
go straight into ``decoder.stream`` (the streamed decoder wraps the same pipeline's VAE).

Out of memory: a CUDA OOM while encoding or denoising frees the failed attempt's blocks and
raises :class:`DeviceOutOfMemory`, like an OOM while decoding, so the task layer retries the
job once at once with ``tiled=True``: the smaller working set. For a generate job that means
every other resident model is evicted, the text encoder moves to the host for good (it is
brought to the GPU only to encode), and the decode runs in spatial tiles. A second OOM is fatal.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from producer.errors import JobCancelled, NonFiniteOutput
from producer.settings import Settings
from producer.wire.spec import GenerateFacts, GenerateSpec, Progress
from worker.devices import nonfinite, out_of_memory
from worker.generate.conditions.read import Conditions, read_conditions
from worker.generate.conditions.text import encode_prompt
from worker.generate.denoise.loop import denoise
from worker.generate.denoise.preview import Previews
from worker.generate.handoff import vae_latents
from worker.generate.model.cache import ModelCache, Resident, module_bytes
from worker.generate.request.check import check_job
from worker.generate.request.folder import ModelInfo
from worker.generate.tier.stance import job_stance
from worker.memory import check_memory


@dataclass
class Generated:
    """Latents (C, T, h, w) in VAE space on the worker's device, the stage times, and what
    the job ran with (for its manifest)."""

    latents: torch.Tensor
    decoder: Any
    load_s: float
    text_encode_s: float
    denoise_s: float
    facts: GenerateFacts
    adapter_load_s: float = 0.0


def _sync(device: torch.device) -> None:
    # Stage times are wall times of GPU work: wait for it (the decode waits for it anyway).
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _host_text_encoder(entry: Resident) -> None:
    """Keep this model's text encoder on the host from now on (the lean retry)."""
    if not entry.text_on_host and torch.device(entry.pipe.vae.device).type == "cuda":
        entry.pipe.text_encoder.to("cpu")
        entry.bytes -= module_bytes(entry.pipe.text_encoder)
        entry.text_on_host = True


def generate_latents(
    gen: GenerateSpec, models: ModelCache, settings: Settings, *, job_id: str,
    progress: Callable[[Progress], None], cancelled: Callable[[], bool], lean: bool = False,
    previews: Previews | None = None,
) -> Generated:
    """Validate against the model folder, load (or reuse) the model, read the job's images and
    LoRAs, encode, denoise (making ``previews``, if given)."""
    t0 = time.perf_counter()
    info = check_job(gen, models.device, settings)
    check_memory(settings, f"before loading {info.path.name}")  # a load can take many GiB
    entry = models.get(info.path, models.resolve_dtype(gen.dtype), gen.tier, info.pipeline)
    if lean:
        models.evict_others(entry)
        _host_text_encoder(entry)
    cond = read_conditions(gen, info, entry, settings)
    load_s = time.perf_counter() - t0 - cond.adapter_load_s

    def step(done: int, total: int) -> None:
        progress(Progress(frames_done=0, frames_total=gen.num_frames, segments_done=0,
                          stage="denoise", steps_done=done, steps_total=total))

    try:
        t1 = time.perf_counter()
        positive, negative = encode_prompt(entry.pipe, gen, models.device,
                                           on_host=entry.text_on_host)
        _sync(models.device)
        t2 = time.perf_counter()
        step(0, gen.num_inference_steps)
        z, compiled = _denoise(models, entry, info, gen, cond, positive, negative, step,
                               cancelled, job_id, previews)
        del positive, negative
        t3 = time.perf_counter()
    except torch.OutOfMemoryError as e:
        raise out_of_memory(e, f"denoising {job_id} (lean={lean})") from e
    facts = GenerateFacts(
        tier=gen.tier, cache=gen.cache.kind if gen.cache else "none",
        cache_params=gen.cache.model_dump(mode="json") if gen.cache else None,
        steps=gen.num_inference_steps, compiled=compiled, image=cond.image,
        last_image=cond.last_image, loras=cond.loras, random_weights=info.random_weights)
    return Generated(z, models.decoder(entry, tiled=lean), load_s, t2 - t1, t3 - t2, facts,
                     cond.adapter_load_s)


def _denoise(models: ModelCache, entry: Resident, info: ModelInfo, gen: GenerateSpec,
             cond: Conditions, positive: torch.Tensor, negative: torch.Tensor | None,
             step: Callable[[int, int], None], cancelled: Callable[[], bool],
             job_id: str, previews: Previews | None = None) -> tuple[torch.Tensor, bool]:
    """The denoise with the job's tier (compiled or not), step cache and adapters; the
    latents in VAE space and whether the transformer ran compiled."""
    with job_stance(models, entry, info, gen, cond) as compiled:
        latents, stopped = denoise(entry.pipe, gen, info, positive, negative, step, cancelled,
                                   images=cond.call, previews=previews)
    if stopped:
        raise JobCancelled(f"job {job_id} cancelled while denoising")
    z = vae_latents(entry.pipe.vae, latents)
    del latents
    _sync(models.device)
    bad = nonfinite(z)  # one reduction: the device waited for the denoise anyway
    if bad:
        raise NonFiniteOutput(
            f"{tier_name(gen)}: the denoise made non-finite latents ({bad} of {z.numel()} "
            "values NaN or infinite); nothing was decoded")
    return z, compiled


def tier_name(gen: GenerateSpec) -> str:
    """``generate.tier fp8`` (with its step cache, if any): what an error names."""
    cache = f", generate.cache {gen.cache.kind}" if gen.cache else ""
    return f"generate.tier {gen.tier}{cache}"
