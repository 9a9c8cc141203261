"""Latents from the denoiser to the streamed decoder, on the GPU: no host copy, no S3.

``WanPipeline`` returns latents normalised by the VAE's per-channel statistics; its decode
path first undoes that (``latents / (1 / std) + mean`` in the VAE's dtype) and so does
:func:`vae_latents`, with the same operations in the same order, so the frames equal what
diffusers' own decode of these latents would be given. The result is the tensor a decode job
reads from ``input.uri``: ``latents.safetensors`` holds it, so a later re-encode skips the
denoising.
"""

from __future__ import annotations

from typing import Any

import torch

LATENTS_FILE = "latents.safetensors"


def vae_latents(vae: Any, latents: torch.Tensor) -> torch.Tensor:
    """(1, C, T, h, w) denoiser latents → (C, T, h, w) in VAE latent space, same device."""
    z = latents.to(dtype=vae.dtype)
    channels = vae.config.z_dim
    mean = torch.tensor(vae.config.latents_mean).view(1, channels, 1, 1, 1).to(z.device, z.dtype)
    inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, channels, 1, 1, 1).to(
        z.device, z.dtype
    )
    return (z / inv_std + mean)[0]


def latents_file(z: torch.Tensor) -> bytes:
    """``latents.safetensors`` (one float32 tensor "latents", (C, T, h, w)): exact for bf16."""
    from safetensors.torch import save

    return save({"latents": z.detach().float().cpu().contiguous()})
