"""Prompt → text embeddings, with diffusers' own ``WanPipeline.encode_prompt``.

Encoded outside the denoising call so the job can time it as its own stage and, when the text
encoder lives on the host between jobs, bring it to the GPU only for this. The embeddings are
what ``WanPipeline.__call__`` would compute itself from the same prompt (same tokenizer
settings, same ``max_sequence_length``): passing them in changes no latent.
"""

from __future__ import annotations

from typing import Any

import torch

from producer.wire.spec import GenerateSpec

#: ``WanPipeline.__call__``'s default: prompts are padded/truncated to this many tokens.
MAX_SEQUENCE_LENGTH = 512


def uses_cfg(gen: GenerateSpec) -> bool:
    """Classifier-free guidance runs when the (first) guidance scale is above 1, as in diffusers."""
    return gen.guidance_scale > 1.0


@torch.no_grad()
def encode_prompt(
    pipe: Any, gen: GenerateSpec, device: torch.device, on_host: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(prompt_embeds, negative_prompt_embeds or None without guidance) on ``device``.

    ``on_host``: the text encoder is kept on the CPU between jobs; it is moved to ``device``
    for the encode and back after it (the move is part of this stage's time).
    """
    encoder = pipe.text_encoder
    if on_host:
        encoder.to(device)
    try:
        positive, negative = pipe.encode_prompt(
            prompt=gen.prompt,
            negative_prompt=gen.negative_prompt,
            do_classifier_free_guidance=uses_cfg(gen),
            max_sequence_length=MAX_SEQUENCE_LENGTH,
            device=device,
        )
    finally:
        if on_host:
            encoder.to("cpu")
    return positive, negative
