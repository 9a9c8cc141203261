"""Image-to-video and LoRA jobs in-process on the tiny pipelines: latents equal diffusers' own
pipelines given the same components, image, LoRA and seed; what a model cannot take fails at
once naming the field; adapters never leak from one job into another."""

from __future__ import annotations

import pickle
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from producer.errors import InvalidJobError
from producer.settings import Settings
from producer.wire.spec import JobResult, JobSpec, OutputSpec, VideoSpec
from tests.worker.generate.tiny import (
    make_lora,
    reference_i2v_latents,
    reference_latents,
    reference_lora_latents,
    tiny_generate,
)
from worker.inputs.image import load_image
from worker.run import DecoderCache, Run, default_decoders, run_job

SETTINGS = Settings(device="cpu", file_roots=tempfile.gettempdir())


_JOBS = iter(range(10**6))


def _run(decoders: DecoderCache, out: Path, model: Path,
         **gen: Any) -> tuple[JobResult, torch.Tensor]:
    spec = JobSpec(job_id=f"j{next(_JOBS)}",
                   generate=tiny_generate(model, save_latents=True, **gen),
                   output=OutputSpec(uri=out.as_uri()), video=VideoSpec(segment_frames=4))
    result = run_job(spec, decoders, Run(spec, settings=SETTINGS))
    assert result.manifest.latents_uri is not None
    return result, load_file(result.manifest.latents_uri.removeprefix("file://"))["latents"]


@pytest.mark.parametrize(("layout", "size"), [("ti2v", (64, 64)), ("i2v", (32, 48))])
def test_image_to_video_equals_diffusers(wan22_models: dict[str, Path], i2v_model: Path,
                                         images: dict[str, Path], tmp_path: Path, layout: str,
                                         size: tuple[int, int]) -> None:
    model = wan22_models["tiny-ti2v"] if layout == "ti2v" else i2v_model
    h, w = size
    uri = images["png"].as_uri()
    result, z = _run(default_decoders(SETTINGS), tmp_path, model, height=h, width=w, image=uri)
    facts = result.manifest.generate
    assert facts is not None and facts.image is not None
    assert (facts.image.source_size, facts.image.size, facts.image.resize) == ((60, 40),
                                                                               (w, h), "crop")
    sized = load_image(uri, "generate.image", w, h, "crop", SETTINGS).image
    gen = tiny_generate(model, height=h, width=w, image=uri)
    assert torch.equal(z, reference_i2v_latents(gen, sized))


def test_last_image_on_the_two_expert_i2v_layout(images: dict[str, Path],
                                                 tmp_path: Path) -> None:
    from tests.worker.generate.tiny import save_tiny_model

    model = save_tiny_model(tmp_path / "a14b-i2v", preset="tiny-i2v-a14b")
    first, last = images["png"].as_uri(), images["jpg"].as_uri()
    result, z = _run(default_decoders(SETTINGS), tmp_path / "o", model, image=first,
                     last_image=last)
    facts = result.manifest.generate
    assert facts is not None and facts.last_image is not None
    assert facts.last_image.source_size == (50, 50) and facts.last_image.format == "JPEG"
    a, b = (load_image(u, "x", 48, 32, "crop", SETTINGS).image for u in (first, last))
    gen = tiny_generate(model, image=first, last_image=last)
    assert torch.equal(z, reference_i2v_latents(gen, a, b))


def test_what_a_model_cannot_take_fails_naming_the_field(
    tiny_model: Path, wan22_models: dict[str, Path], i2v_model: Path,
    images: dict[str, Path], tmp_path: Path,
) -> None:
    decoders = default_decoders(SETTINGS)
    png = images["png"].as_uri()
    with pytest.raises(InvalidJobError, match="generate.image: .* is a text-to-video model"):
        _run(decoders, tmp_path, tiny_model, image=png)
    with pytest.raises(InvalidJobError, match="generate.image: .* is an image-to-video model"):
        _run(decoders, tmp_path, i2v_model)
    for model, size in ((wan22_models["tiny-ti2v"], 64), (i2v_model, None)):
        dims = {"height": size, "width": size} if size else {}
        with pytest.raises(InvalidJobError, match="generate.last_image: .* takes no last frame"):
            _run(decoders, tmp_path, model, image=png, last_image=png, **dims)
    with pytest.raises(InvalidJobError, match=r"generate.loras\[0\].expert: high_noise is for "
                                              "two-expert models"):
        lora = {"uri": (tmp_path / "x.safetensors").as_uri(), "expert": "high_noise"}
        _run(decoders, tmp_path, tiny_model, loras=[lora])
    assert decoders.models.keys() == []  # refused before any model was loaded


def test_loras_equal_diffusers_and_never_leak(tiny_model: Path, tmp_path: Path) -> None:
    a = make_lora(tiny_model, tmp_path / "a.safetensors", seed=1)
    b = make_lora(tiny_model, tmp_path / "b.safetensors", seed=2, rank=2)
    decoders = default_decoders(SETTINGS)
    out = tmp_path / "out"
    _, plain = _run(decoders, out, tiny_model)
    assert torch.equal(plain, reference_latents(tiny_generate(tiny_model)))
    # a LoRA job: diffusers' latents with the same LoRA loaded, and its load timed
    one, z1 = _run(decoders, out, tiny_model, loras=[{"uri": a.as_uri(), "scale": 1.0}])
    assert torch.equal(z1, reference_lora_latents(tiny_generate(tiny_model), [(a, 1.0)]))
    assert one.timings.adapter_load_s > 0
    facts = one.manifest.generate
    assert facts is not None and facts.loras[0].scale == 1.0 and len(facts.loras[0].sha256) == 64
    # the same file at another scale: what a fresh load at that scale gives; not loaded again
    half, z_half = _run(decoders, out, tiny_model, loras=[{"uri": a.as_uri(), "scale": 0.5}])
    assert half.timings.adapter_load_s == 0
    assert torch.equal(z_half, reference_lora_latents(tiny_generate(tiny_model), [(a, 0.5)]))
    # two at once
    _, z2 = _run(decoders, out, tiny_model, loras=[{"uri": a.as_uri(), "scale": 1.0},
                                                   {"uri": b.as_uri(), "scale": 0.7}])
    assert torch.equal(z2, reference_lora_latents(tiny_generate(tiny_model),
                                                  [(a, 1.0), (b, 0.7)]))
    # and a job without LoRA afterwards: a fresh worker's latents
    _, after = _run(decoders, out, tiny_model)
    assert torch.equal(after, plain)


def test_bad_loras_fail_and_leave_the_base_exact(tiny_model: Path, i2v_model: Path,
                                                 tmp_path: Path) -> None:
    decoders = default_decoders(SETTINGS)
    _, plain = _run(decoders, tmp_path / "a", tiny_model)
    other = make_lora(i2v_model, tmp_path / "other.safetensors",  # another model's widths
                      targets=("add_k_proj",))
    with pytest.raises(InvalidJobError, match=r"generate.loras\[0\]: .*other.safetensors does "
                                              "not fit this model"):
        _run(decoders, tmp_path / "b", tiny_model, loras=[{"uri": other.as_uri()}])
    fake = tmp_path / "model.safetensors"
    fake.write_bytes(pickle.dumps({"w": [1.0, 2.0]}))  # a pickle, named .safetensors
    with pytest.raises(InvalidJobError, match=r"generate.loras\[0\]: .* is a pickle or zip "
                                              "checkpoint .* refused"):
        _run(decoders, tmp_path / "c", tiny_model, loras=[{"uri": fake.as_uri()}])
    # A LoRA made for the ti2v layout fits a t2v model's widths: its metadata says whose it is
    from worker.generate.model.tiny import write_tiny

    ti2v = tmp_path / "ti2v.safetensors"
    write_tiny(tmp_path / "ti2v-model", "ti2v", lora=ti2v)
    with pytest.raises(InvalidJobError, match=r"generate.loras\[0\]: .*ti2v.safetensors is a "
                                              "LoRA made for a ti2v model; this model is t2v"):
        _run(decoders, tmp_path / "e", tiny_model, loras=[{"uri": ti2v.as_uri()}])
    _, again = _run(decoders, tmp_path / "d", tiny_model)
    assert torch.equal(again, plain)  # the base model untouched


def test_adapters_beyond_the_budget_are_unloaded(tiny_model: Path, tmp_path: Path) -> None:
    from worker.generate.conditions.adapters import _evict

    paths = [make_lora(tiny_model, tmp_path / f"l{i}.safetensors", seed=i) for i in range(3)]
    decoders = default_decoders(SETTINGS)
    _, plain = _run(decoders, tmp_path / "p", tiny_model)
    for path in paths:
        _run(decoders, tmp_path / path.stem, tiny_model, loras=[{"uri": path.as_uri()}])
    entry = decoders.models.get(tiny_model, torch.float32)
    adapters = entry.adapters
    assert adapters is not None and len(adapters.loaded) == 3
    assert set(entry.pipe.transformer.peft_config) == set(adapters.loaded)
    # Over a budget of one and a half adapters: the least recently used go, the newest stays
    one = next(iter(adapters.loaded.values())).bytes
    newest = list(adapters.loaded)[-1]
    _evict(entry.pipe, adapters, set(), one * 3 // 2)
    assert list(adapters.loaded) == [newest]
    assert set(entry.pipe.transformer.peft_config) == {newest}
    _, after = _run(decoders, tmp_path / "q", tiny_model)
    assert torch.equal(after, plain)
    # the last one gone: peft's layers are unloaded, the model is its plain self again
    _evict(entry.pipe, adapters, set(), 0)
    assert not adapters.any() and not getattr(entry.pipe.transformer,
                                              "_hf_peft_config_loaded", False)
    _, bare = _run(decoders, tmp_path / "r", tiny_model)
    assert torch.equal(bare, plain)
