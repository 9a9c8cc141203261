"""Decoders: the streamed Wan decode equals diffusers' vae.decode; pattern frames are readable."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from worker.decoders.base import frames_for_latents
from worker.decoders.pattern import PatternDecoder, pattern_frames, read_frame_index
from worker.decoders.wan import WanDecoder, build_vae


@pytest.mark.parametrize("latent_frames", [1, 2, 5])
def test_streamed_wan_equals_vae_decode(latent_frames: int) -> None:
    # Given the Wan architecture (tiny config) and random latents
    vae = build_vae("tiny", seed=3)
    z = torch.randn(1, 16, latent_frames, 4, 6, generator=torch.Generator().manual_seed(7))
    # When decoded by diffusers in one call, and by our stream chunk by chunk
    reference = vae.decode(z).sample[0]
    chunks = list(WanDecoder(vae).stream(z[0]))
    # Then the chunks have the Wan layout (1 frame, then 4 per latent frame) and equal it
    assert [c.shape[1] for c in chunks] == [1] + [4] * (latent_frames - 1)
    streamed = torch.cat(chunks, dim=1)
    assert streamed.shape == reference.shape == (3, frames_for_latents(latent_frames), 32, 48)
    torch.testing.assert_close(streamed, reference, rtol=1e-5, atol=1e-5)


def test_stream_twice_gives_same_output() -> None:
    # The causal cache is cleared per job: a second job must not see the first one's state.
    decoder = WanDecoder(build_vae("tiny"))
    z = torch.randn(16, 3, 4, 4)
    first = torch.cat(list(decoder.stream(z)), dim=1)
    second = torch.cat(list(decoder.stream(z)), dim=1)
    torch.testing.assert_close(first, second)


def test_seeded_init_is_deterministic() -> None:
    a = build_vae("tiny", seed=1).state_dict()
    b = build_vae("tiny", seed=1).state_dict()
    c = build_vae("tiny", seed=2).state_dict()
    key = next(k for k in a if k.endswith("weight"))
    assert torch.equal(a[key], b[key]) and not torch.equal(a[key], c[key])


def test_from_pretrained_local_folder(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Given a diffusers-layout folder saved from a seeded model
    vae = build_vae("tiny", seed=5)
    vae.save_pretrained(tmp_path / "vae")
    # When it is loaded back as weights
    loaded = build_vae(weights_dir=str(tmp_path / "vae"))
    z = torch.randn(1, 16, 2, 4, 4)
    # Then it decodes exactly like the original
    torch.testing.assert_close(loaded.decode(z).sample, vae.decode(z).sample)


def test_pattern_index_round_trip_in_rgb() -> None:
    frames = pattern_frames(123_456, 3, 64, 96)
    for k in range(3):
        rgb = ((frames[:, k].permute(1, 2, 0) + 1) * 127.5).round().to(torch.uint8).numpy()
        assert read_frame_index(rgb) == 123_456 + k


def test_pattern_decoder_chunk_layout() -> None:
    chunks = list(PatternDecoder().stream(torch.zeros(16, 4, 2, 3)))
    assert [c.shape for c in chunks] == [(3, 1, 16, 24)] + [(3, 4, 16, 24)] * 3


def test_read_frame_index_rejects_bad_shape() -> None:
    with pytest.raises(ValueError, match="H, W, 3"):
        read_frame_index(np.zeros((8, 8), np.uint8))


def test_streamed_tiled_wan_equals_tiled_decode() -> None:
    # Given small tiles so a small clip spans several tiles in both directions
    vae = build_vae("tiny", seed=2)
    vae.enable_tiling(tile_sample_min_height=32, tile_sample_min_width=32,
                      tile_sample_stride_height=24, tile_sample_stride_width=24)
    z = torch.randn(1, 16, 3, 7, 9, generator=torch.Generator().manual_seed(4))
    # When decoded by diffusers' tiled_decode, and by our stream with tiling
    reference = vae.tiled_decode(z).sample[0]
    chunks = list(WanDecoder(vae).with_tiling().stream(z[0]))
    # Then chunk by chunk they are the same frames
    assert [c.shape[1] for c in chunks] == [1, 4, 4]
    torch.testing.assert_close(torch.cat(chunks, dim=1), reference, rtol=1e-5, atol=1e-5)


def test_warmup_holds_the_device() -> None:
    """A warm-up's decode holds the device as a job (nested inside the worker's own warm-up
    job): called outside one, as a benchmark does, it must not run beside a build, whose
    CUDA-graph capture it would break."""
    from worker.owner import DEVICE

    decoder = WanDecoder(build_vae("tiny"))
    held: list[bool] = []
    # every module's forward in the process, whichever path (step or modules) decodes
    hook = torch.nn.modules.module.register_module_forward_pre_hook(
        lambda *_: held.append(DEVICE.holds()))
    try:
        decoder.warmup(4, 4)
        with DEVICE.job("the worker's warm-up"):  # nested: the same thread, no deadlock
            decoder.warmup(4, 4)
    finally:
        hook.remove()
    assert held and all(held)
    assert not DEVICE.holds()
