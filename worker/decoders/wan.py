"""Wan2.1 VAE decoder (diffusers ``AutoencoderKLWan``), streamed one latent frame at a time.

diffusers' own ``_decode`` runs the decoder per latent frame with a causal feature cache and
concatenates everything into one video tensor: memory grows with video length. ``stream`` does
exactly the same calls but yields each chunk instead, so the pipeline can post-process, copy and
encode chunk i while chunk i+1 decodes, and memory stays flat.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from producer.errors import InvalidJobError
from worker.decoders.base import SPATIAL_RATIO

#: The real Wan2.1 VAE architecture (diffusers' defaults).
WAN21: dict[str, Any] = {}
#: A few-channel version of the same architecture: for tests and the CPU demo.
TINY: dict[str, Any] = {"base_dim": 8, "num_res_blocks": 1}
PRESETS = {"wan2.1": WAN21, "tiny": TINY}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_vae(
    preset: str = "wan2.1", weights_dir: str | None = None, seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> Any:
    """``from_pretrained`` of a local diffusers-layout folder, else a seeded random init."""
    from diffusers import AutoencoderKLWan

    if weights_dir is not None:
        try:
            vae = AutoencoderKLWan.from_pretrained(weights_dir, torch_dtype=dtype)
        except (OSError, ValueError) as e:
            raise InvalidJobError(f"decoder.weights: cannot load {weights_dir}: {e}") from e
    else:
        if preset not in PRESETS:
            raise InvalidJobError(f"decoder.preset: unknown preset {preset!r}")
        gen_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        try:
            model: Any = AutoencoderKLWan(**PRESETS[preset])
        finally:
            torch.random.set_rng_state(gen_state)
        vae = model if dtype == torch.float32 else model.to(dtype)
    return vae.eval().requires_grad_(False)


class WanDecoder:
    """Streams ``AutoencoderKLWan`` decoding; output equals ``vae.decode(z)`` chunk by chunk."""

    name = "wan2.1-vae"

    def __init__(self, vae: Any, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.vae = vae.to(self.device)
        self.dtype: torch.dtype = next(self.vae.parameters()).dtype
        self.latent_channels = int(self.vae.config.z_dim)
        self.patch_size = self.vae.config.get("patch_size")

    def output_size(self, latent_h: int, latent_w: int) -> tuple[int, int]:
        scale = SPATIAL_RATIO * (self.patch_size or 1)
        return latent_h * scale, latent_w * scale

    def warmup(self, latent_h: int, latent_w: int) -> None:
        z = torch.randn((self.latent_channels, 2, latent_h, latent_w))
        for _ in self.stream(z):
            pass

    @torch.inference_mode()
    def stream(self, latents: torch.Tensor) -> Iterator[torch.Tensor]:
        from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

        vae = self.vae
        z = latents.to(self.device, self.dtype, non_blocking=True).unsqueeze(0)
        vae.clear_cache()
        try:
            for i in range(z.shape[2]):
                # post_quant_conv is a 1×1×1 causal conv: per frame equals on the whole clip.
                x = vae.post_quant_conv(z[:, :, i : i + 1])
                vae._conv_idx = [0]
                out = vae.decoder(
                    x, feat_cache=vae._feat_map, feat_idx=vae._conv_idx, first_chunk=(i == 0)
                )
                if self.patch_size is not None:
                    out = unpatchify(out, patch_size=self.patch_size)
                yield out.clamp_(-1.0, 1.0)[0]
        finally:
            # The cache holds activations of the last chunk: free them between jobs.
            vae.clear_cache()
