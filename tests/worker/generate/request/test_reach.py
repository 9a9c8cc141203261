"""A size or frame count beyond the model's rotary positions is refused before the model loads,
naming the field and the largest value; the arithmetic is diffusers' own: the tiny model's
rotary embedding takes exactly the largest latent the rule allows, and fails one patch beyond."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from diffusers import WanTransformer3DModel

from producer.errors import InvalidJobError
from producer.settings import Settings
from producer.wire.reach import reach
from producer.wire.spec import GenerateSpec
from worker.generate.request.folder import check_request, read_model


def gen(tiny_model: Path, **fields: int) -> GenerateSpec:
    return GenerateSpec.model_validate({"model": tiny_model.as_uri(), "prompt": "x",
                                        "num_inference_steps": 2, "width": 48, "height": 32,
                                        "num_frames": 9, **fields})


def test_the_tiny_models_reach(tiny_model: Path) -> None:
    info = read_model(tiny_model)
    assert info.reach is not None
    # rope_max_seq_len 32, patch (1, 2, 2), VAE 8 and 4
    assert (info.reach.width, info.reach.height, info.reach.frames) == (512, 512, 125)


def test_the_reach_is_what_diffusers_rope_takes(tiny_model: Path) -> None:
    model = WanTransformer3DModel.from_pretrained(tiny_model / "transformer")
    info = read_model(tiny_model)
    r = info.reach
    assert r is not None
    channels = model.config.in_channels

    def latent(frames: int, height: int, width: int) -> torch.Tensor:
        return torch.zeros(1, channels, (frames - 1) // r.temporal + 1,
                           height // r.spatial, width // r.spatial)

    model.rope(latent(r.frames, r.height, r.width))  # the largest: fine
    for over in [(r.frames + r.temporal, r.height, r.width),
                 (r.frames, r.height + 16, r.width), (r.frames, r.height, r.width + 16)]:
        with pytest.raises(RuntimeError, match="is invalid for input of size"):
            model.rope(latent(*over))


@pytest.mark.parametrize(("fields", "message"), [
    ({"width": 528, "height": 512},
     "generate.width: width 528 is over this model's reach: at most 512"),
    ({"width": 48, "height": 1024},
     "generate.height: height 1024 is over this model's reach: at most 512"),
    ({"num_frames": 129}, "generate.num_frames: frames 129 is over this model's reach: at most "
                          "125"),
])
def test_beyond_the_reach_is_refused_before_loading(tiny_model: Path, fields: dict[str, int],
                                                    message: str) -> None:
    settings = Settings(max_pixels=4096 * 4096)
    with pytest.raises(InvalidJobError, match=message):
        check_request(gen(tiny_model, **fields), read_model(tiny_model), settings)
    at_most = {k: min(v, 512 if k != "num_frames" else 125) for k, v in fields.items()}
    check_request(gen(tiny_model, **at_most), read_model(tiny_model), settings)


def test_diffusers_defaults_fill_what_a_config_leaves_out() -> None:
    r = reach({}, {})
    assert (r.width, r.height, r.frames) == (16384, 16384, 4093)
    r = reach({"rope_max_seq_len": 1024, "patch_size": [1, 2, 2]},
              {"scale_factor_spatial": 16, "scale_factor_temporal": 4})  # Wan2.2 TI2V-5B
    assert (r.width, r.height, r.frames) == (32768, 32768, 4093)
    for bad in ({"rope_max_seq_len": 0}, {"rope_max_seq_len": True}, {"patch_size": [1, 2]},
                {"rope_max_seq_len": "32"}):
        with pytest.raises(ValueError, match="not positive integers"):
            reach(bad, {})
