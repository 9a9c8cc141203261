"""Never SUCCESS for non-finite output: a tier whose denoise makes NaN latents, and a decoder
whose frames are NaN, fail the job naming the tier or decoder and the stage, before anything
of it is encoded; in-process with the tiny pipeline (the fleet's view, FAILURE with no retry,
a ledger record and a count, is ``tests/e2e/test_nonfinite_e2e.py``)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from producer.errors import NonFiniteOutput
from producer.settings import Settings
from producer.wire.spec import (
    DecoderSpec,
    InputSpec,
    JobSpec,
    OutputSpec,
    PipelineSpec,
    VideoSpec,
)
from tests.worker.generate.tiny import save_tiny_model, tiny_generate
from worker.run import Run, default_decoders, run_job

SETTINGS = Settings(device="cpu", max_denoise_steps=50, file_roots=tempfile.gettempdir())


def poisoned(model: Path, part: str, folder: Path) -> Path:
    """A copy of ``model`` with NaN in every weight of ``part``'s last layer (by name)."""
    shutil.copytree(model, folder)
    (weights,) = (folder / part).glob("*.safetensors")
    tensors = load_file(weights)
    name = {"transformer": "proj_out.weight", "vae": "decoder.conv_out.weight"}[part]
    tensors[name] = torch.full_like(tensors[name], float("nan"))
    save_file(tensors, weights)
    return folder


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("models") / "tiny-wan")


def _nothing_written(out: Path) -> bool:
    """No segment, playlist or manifest (the previews a denoise made while it ran stay, as a
    cancelled job's do)."""
    return not [p for p in out.rglob("*") if p.suffix in (".mp4", ".json")
                and "previews" not in p.parts]


@pytest.mark.parametrize("cache", [None, {"kind": "first_block", "threshold": 0.05}])
def test_nan_latents_fail_naming_the_tier_and_the_denoise(
    model: Path, tmp_path: Path, cache: dict[str, object] | None
) -> None:
    # Given a tier whose transformer makes NaN (a poisoned output layer)
    bad = poisoned(model, "transformer", tmp_path / "nan-model")
    out = tmp_path / "out"
    spec = JobSpec(job_id="nan-denoise", output=OutputSpec(uri=out.as_uri()),
                   generate=tiny_generate(bad, cache=cache, num_inference_steps=3),
                   video=VideoSpec(segment_frames=4))
    # When the job runs, it fails naming the tier (and cache) and the stage
    with pytest.raises(NonFiniteOutput, match=r"generate\.tier exact.*the denoise made "
                       r"non-finite latents \(\d+ of \d+ values NaN or infinite\)") as err:
        run_job(spec, default_decoders(SETTINGS), Run(spec, settings=SETTINGS))
    if cache:
        assert "generate.cache first_block" in str(err.value)
    # and nothing was encoded or written: no segment, no manifest
    assert _nothing_written(out)


@pytest.mark.parametrize("mode", ["async", "sequential"])
def test_nan_frames_fail_naming_the_decoder_and_the_decode(
    model: Path, tmp_path: Path, mode: str
) -> None:
    # Given finite latents and a decoder whose last conv makes NaN frames
    vae = poisoned(model, "vae", tmp_path / "nan-model") / "vae"
    np.save(tmp_path / "z.npy", np.random.default_rng(0).standard_normal((16, 3, 4, 6),
                                                                          np.float32))
    out = tmp_path / "out"
    spec = JobSpec(job_id="nan-decode", input=InputSpec(uri=(tmp_path / "z.npy").as_uri()),
                   decoder=DecoderSpec(name="wan2.1-vae", weights=vae.as_uri()),
                   output=OutputSpec(uri=out.as_uri()), pipeline=PipelineSpec(mode=mode),
                   video=VideoSpec(segment_frames=4))
    # When it decodes, the first chunk is refused before it is encoded
    with pytest.raises(NonFiniteOutput, match=r"decoder wan2\.1-vae: decode: \d+ NaN or "
                       r"infinite values in frames 0-0; not encoded"):
        run_job(spec, default_decoders(SETTINGS), Run(spec, settings=SETTINGS))
    assert _nothing_written(out)
