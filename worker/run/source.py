"""Where a run's latents come from: loaded from ``input.uri``, or generated from a prompt.

Either way the result is the same: latents (C, T, h, w) in VAE space on the worker's device,
the decoder that turns them into frames, and the seconds each stage took. A new kind of input
(an image to animate, adapters to load) is a change here and in ``worker.generate``; the
publisher and the finish do not change.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from producer.wire.spec import GenerateFacts, GenerateSpec, InputSpec
from worker.decoders.base import ChunkDecoder
from worker.generate import generate_latents
from worker.generate.denoise.preview import Previews
from worker.inputs.latents import load_latents
from worker.run.decoders import DecoderCache
from worker.run.run import Run


@dataclass
class Latents:
    """A run's latents on the device, their decoder, and the stages that produced them."""

    decoder: ChunkDecoder
    tensor: torch.Tensor
    #: Seconds per stage of ``producer.wire.spec.STAGE_NAMES`` before the decode (load,
    #: text_encode, denoise).
    seconds: dict[str, float] = field(default_factory=dict)
    #: A generated run's settings and inputs, for its manifest.
    facts: GenerateFacts | None = None


def latents_for(run: Run, decoders: DecoderCache, previews: Previews | None = None) -> Latents:
    """The run's latents: generated when the spec has ``generate`` (making ``previews`` while
    it denoises, if given), else loaded."""
    if run.spec.generate is not None:
        return _generated(run, run.spec.generate, decoders, previews)
    assert run.spec.input is not None  # JobSpec: exactly one of input and generate
    return _loaded(run, run.spec.input, decoders)


def _loaded(run: Run, source: InputSpec, decoders: DecoderCache) -> Latents:
    t0 = time.perf_counter()
    decoder = decoders.get(run.spec.decoder)
    if run.tiled and hasattr(decoder, "with_tiling"):
        decoder = decoder.with_tiling()
    tensor = load_latents(source, decoder.latent_channels, run.settings)
    return Latents(decoder, tensor, {"load": time.perf_counter() - t0})


def _generated(run: Run, gen: GenerateSpec, decoders: DecoderCache,
               previews: Previews | None) -> Latents:
    # Prompt in: the latents are denoised here and stay on the GPU for the decoder.
    out = generate_latents(
        gen, decoders.models, run.settings, job_id=run.spec.job_id, progress=run.report,
        cancelled=run.cancelled, lean=run.tiled, previews=previews,
    )
    return Latents(out.decoder, out.latents, {
        "load": out.load_s, "adapter_load": out.adapter_load_s,
        "text_encode": out.text_encode_s, "denoise": out.denoise_s,
    }, out.facts)
