"""Wan2.2's own VAE (TI2V-5B layout: 48 latent channels, residual up blocks, 2×2 patching,
16× spatial) through the pure step: equal to diffusers, on the CPU, on the tiny preset."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from producer.errors import InvalidJobError
from producer.settings import Settings
from producer.wire.spec import DecoderSpec, InputSpec, parse_spec
from worker.decoders.wan import PRESETS, WanDecoder, build_vae
from worker.inputs.latents import check_latents


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize(("latent_frames", "h", "w"), [(1, 4, 4), (2, 4, 4), (7, 4, 4),
                                                       (3, 3, 7)])
def test_streamed_wan22_equals_vae_decode(latent_frames: int, h: int, w: int) -> None:
    # Given the Wan2.2 architecture (tiny channels, fp32) and random 48-channel latents,
    # square and not
    vae = build_vae("tiny-wan2.2", seed=3)
    z = torch.randn(1, 48, latent_frames, h, w, generator=torch.Generator().manual_seed(h * w))
    # When diffusers decodes the clip in one call and the decoder streams it chunk by chunk
    with torch.inference_mode():
        reference = vae.decode(z).sample[0]
    decoder = WanDecoder(vae)
    chunks = list(decoder.stream(z[0]))
    # Then the chunk layout is Wan's (1 frame, then 4 per latent frame), frames are 16× the
    # latents, and the frames are diffusers' to fp32 rounding
    assert [c.shape[1] for c in chunks] == [1] + [4] * (latent_frames - 1)
    assert decoder.output_size(h, w) == (16 * h, 16 * w) == tuple(reference.shape[-2:])
    out = torch.cat(chunks, dim=1)
    assert out.shape == reference.shape
    assert _rel(out, reference) < 1e-5


def test_wan22_decoder_identity() -> None:
    decoder = WanDecoder(build_vae("tiny-wan2.2"))
    assert decoder.name == "wan2.2-vae" and decoder.latent_channels == 48
    assert decoder.step is not None  # the pure step, not diffusers' module loop
    assert WanDecoder(build_vae("tiny")).name == "wan2.1-vae"
    # the full preset is diffusers' TI2V-5B VAE config
    cfg = PRESETS["wan2.2"]
    assert (cfg["z_dim"], cfg["decoder_base_dim"], cfg["patch_size"], cfg["is_residual"],
            cfg["scale_factor_spatial"]) == (48, 256, 2, True, 16)
    assert len(cfg["latents_mean"]) == len(cfg["latents_std"]) == 48


def test_streamed_tiled_wan22_equals_tiled_decode() -> None:
    # The out-of-memory fallback: tiles spanning the clip both ways, patching undone after
    # the blend, exactly as diffusers' tiled_decode does it
    vae = build_vae("tiny-wan2.2", seed=2)
    vae.enable_tiling(tile_sample_min_height=64, tile_sample_min_width=64,
                      tile_sample_stride_height=48, tile_sample_stride_width=48)
    z = torch.randn(1, 48, 3, 7, 9, generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        reference = vae.tiled_decode(z).sample[0]
    chunks = list(WanDecoder(vae).with_tiling().stream(z[0]))
    assert [c.shape[1] for c in chunks] == [1, 4, 4]
    out = torch.cat(chunks, dim=1)
    assert out.shape == reference.shape == (3, 9, 7 * 16, 9 * 16)
    assert _rel(out, reference) < 1e-5


def test_wan21_latents_given_to_the_wan22_decoder_fail_naming_the_input() -> None:
    decoder = WanDecoder(build_vae("tiny-wan2.2"))
    spec = InputSpec(uri="file:///in/wan21.safetensors")
    with pytest.raises(InvalidJobError, match=r"input file:///in/wan21.safetensors: 16 latent "
                                              r"channels, the decoder expects 48"):
        check_latents(torch.randn(16, 2, 4, 4), spec, decoder.latent_channels, Settings())


def test_spec_resolves_the_decoders_preset_and_frame_rate() -> None:
    base = {"job_id": "j", "input": {"uri": "file:///in/z.npy"}, "output": {"uri": "file:///o"}}
    job = parse_spec({**base, "decoder": {"name": "wan2.2-vae"}})
    assert job.decoder.preset == "wan2.2" and job.video.fps == 24.0  # Wan2.2-5B's 24 fps
    assert parse_spec(job.model_dump(mode="json")).digest() == job.digest()
    assert parse_spec({**base, "decoder": {"name": "wan2.2-vae"},
                       "video": {"fps": 30}}).video.fps == 30.0  # the job's own wins
    old = parse_spec(base)  # Wan2.1 jobs unchanged: same preset, 16 fps
    assert old.decoder.preset == "wan2.1" and old.video.fps == 16.0
    assert DecoderSpec(name="wan2.2-vae", preset="tiny-wan2.2").preset == "tiny-wan2.2"
    with pytest.raises(InvalidJobError, match="decoder.preset"):
        parse_spec({**base, "decoder": {"name": "wan2.2-vae", "preset": "wan2.1"}})


def test_weights_folder_of_the_other_architecture_is_refused(tmp_path: Path) -> None:
    build_vae("tiny").save_pretrained(tmp_path / "wan21")
    build_vae("tiny-wan2.2", seed=1).save_pretrained(tmp_path / "wan22")
    loaded = build_vae("wan2.2", str(tmp_path / "wan22"))
    assert WanDecoder(loaded).name == "wan2.2-vae"
    with pytest.raises(InvalidJobError, match="decoder.weights: .* holds a wan2.1-vae model"):
        build_vae("wan2.2", str(tmp_path / "wan21"))
