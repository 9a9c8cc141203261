"""The denoising loop: diffusers' ``WanPipeline.__call__`` with ``output_type="latent"``.

framefleet adds only what a fleet job needs around it: a fresh scheduler per job (from the
model's config, with the spec's flow shift), the spec's boundary between two experts, a seeded
``torch.Generator``, and ``callback_on_step_end`` for progress and cooperative cancellation
(diffusers' ``_interrupt`` flag: the remaining steps are skipped); with previews, a watch on
the job's scheduler that reads the x0 estimate (``worker.generate.denoise.preview``). The sampler is
diffusers'.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from producer.wire.spec import GenerateSpec
from worker.generate.denoise.preview import Previews, attach
from worker.generate.request.folder import ModelInfo


def job_pipeline(pipe: Any, gen: GenerateSpec, info: ModelInfo, i2v: bool = False) -> Any:
    """A ``WanPipeline`` (``i2v``: a ``WanImageToVideoPipeline``) over the resident
    components, with this job's scheduler and boundary.

    The resident pipeline is never mutated: a scheduler carries per-run state, and two jobs
    with different flow shifts must not see each other's.
    """
    from diffusers import WanImageToVideoPipeline, WanPipeline

    overrides = {}
    if gen.flow_shift is not None and info.shift_key is not None:
        overrides[info.shift_key] = gen.flow_shift
    scheduler = type(pipe.scheduler).from_config(pipe.scheduler.config, **overrides)
    boundary = gen.boundary_ratio if gen.boundary_ratio is not None else pipe.config.boundary_ratio
    parts: dict[str, Any] = dict(
        tokenizer=pipe.tokenizer, text_encoder=pipe.text_encoder, vae=pipe.vae,
        scheduler=scheduler, transformer=pipe.transformer, transformer_2=pipe.transformer_2,
        boundary_ratio=boundary, expand_timesteps=pipe.config.expand_timesteps,
    )
    if i2v:  # Wan2.1 I2V's CLIP image encoder, where the model has one
        run: Any = WanImageToVideoPipeline(
            **parts, image_encoder=getattr(pipe, "image_encoder", None),
            image_processor=getattr(pipe, "image_processor", None))
    else:
        run = WanPipeline(**parts)
    run.set_progress_bar_config(disable=True)
    return run


def generator(gen: GenerateSpec) -> torch.Generator:
    """A CPU generator seeded from the spec: the same initial noise on every device, so a job
    run again (on this or another GPU of the fleet) starts from the same latents."""
    return torch.Generator("cpu").manual_seed(gen.seed)


def denoise(
    pipe: Any, gen: GenerateSpec, info: ModelInfo,
    positive: torch.Tensor, negative: torch.Tensor | None,
    step: Callable[[int, int], None], cancelled: Callable[[], bool],
    images: dict[str, Any] | None = None, previews: Previews | None = None,
) -> tuple[torch.Tensor, bool]:
    """Run the loop; returns (latents (1, C, T, h, w) normalised as the transformer sees them,
    whether it was cancelled). ``step(done, total)`` is called after every step. ``images``
    (``image``, ``last_image``: sized PIL images) make it diffusers' image-to-video call.
    ``previews`` get the model's x0 estimate after the steps they want."""
    images = images or {}
    run = job_pipeline(pipe, gen, info, i2v="image" in images)
    if previews is not None:
        attach(previews, run, gen, info, positive.device)
    stopped = False

    def on_step_end(p: Any, i: int, t: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        nonlocal stopped
        step(i + 1, p.num_timesteps)
        if not stopped and cancelled():
            stopped = True
            p._interrupt = True  # diffusers skips the remaining steps
        return {}

    latents = run(
        prompt=None,
        prompt_embeds=positive,
        negative_prompt_embeds=negative,
        height=gen.height,
        width=gen.width,
        num_frames=gen.num_frames,
        num_inference_steps=gen.num_inference_steps,
        guidance_scale=gen.guidance_scale,
        guidance_scale_2=gen.guidance_scale_2,
        generator=generator(gen),
        output_type="latent",
        return_dict=False,
        callback_on_step_end=on_step_end,
        callback_on_step_end_tensor_inputs=[],
        **images,
    )[0]
    return latents, stopped
