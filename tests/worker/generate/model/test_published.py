"""The published Wan folders at tiny sizes (``tests.worker.generate.published``): each passes
the loader's check, loads through the fast path to the very tensors diffusers'
``from_pretrained(dtype=...)`` gives, and runs a job whose latents equal diffusers' own; a
mixed-up download is refused naming the file, as a fatal error."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from producer.errors import FatalJobError, InvalidJobError, PathRefusedError, RetryableError
from producer.settings import Settings
from producer.wire.spec import JobSpec, OutputSpec, VideoSpec
from tests.worker.generate.published import PUBLISHED, write_published
from tests.worker.generate.tiny import reference_i2v_latents, reference_latents, tiny_generate
from worker import quiet
from worker.generate.model.cache import ModelCache
from worker.generate.model.fastload import MODELS, load_pipeline
from worker.generate.request.folder import model_folder
from worker.inputs.image import load_image
from worker.run import Run, default_decoders, run_job

SETTINGS = Settings(device="cpu", file_roots=tempfile.gettempdir())
#: Each layout's job: its size (multiples of its VAE x patch), and an image where it takes one.
SIZES = {"Wan2.2-TI2V-5B": (64, 64)}


@pytest.fixture(scope="session")
def published(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("published")
    return {name: write_published(root / name, name) for name in PUBLISHED}


def _tensors(module: Any) -> dict[str, torch.Tensor]:
    return {**dict(module.named_parameters()), **dict(module.named_buffers())}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_the_fast_path_loads_what_diffusers_loads(published: dict[str, Path], name: str) -> None:
    import diffusers

    folder, layout = published[name], PUBLISHED[name]
    # Given the folder as published: float32 transformer shards, an index, the tokenizer files
    shards = sorted(p.name for p in (folder / "transformer").glob("*.safetensors"))
    assert len(shards) == layout.shards["transformer"]
    assert {p.name for p in (folder / "tokenizer").iterdir()} == {
        "spiece.model", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}
    assert model_folder(folder.as_uri(), SETTINGS) == folder.resolve()
    for dtype in (torch.bfloat16, torch.float16):
        # When it is read by both paths in a half-precision job dtype
        ref = getattr(diffusers, layout.pipeline).from_pretrained(
            str(folder), **quiet.dtype_kwargs(dtype))
        pipe, times = load_pipeline(folder, layout.pipeline, dtype, torch.device("cpu"), 3)
        # Then every tensor of every model is the same, bit for bit and dtype for dtype
        assert dict(pipe.config) == dict(ref.config)
        for component in MODELS:
            a, b = getattr(ref, component, None), getattr(pipe, component, None)
            assert (a is None) == (b is None), component
            if a is None or b is None:
                continue
            want, got = _tensors(a), _tensors(b)
            assert want.keys() == got.keys()
            for key, tensor in want.items():
                assert got[key].dtype == tensor.dtype, (component, key)
                assert torch.equal(got[key], tensor), (component, key)
            assert not b.training
        te = pipe.text_encoder  # the tied embedding is one tensor, as from_pretrained ties it
        assert te.shared.weight is te.encoder.embed_tokens.weight
        assert times.shards == sum(len(list((folder / c).glob("*.safetensors")))
                                   for c in layout.components)


def test_a_tie_the_checkpoint_stores_twice_with_two_values_stays_untied(
    published: dict[str, Path], tmp_path: Path
) -> None:
    import diffusers

    # Given a text encoder whose checkpoint holds both sides of its tied embedding, different
    folder = tmp_path / "two-embeddings"
    shutil.copytree(published["Wan2.1-T2V-1.3B"], folder)
    te = folder / "text_encoder"
    index = json.loads((te / "model.safetensors.index.json").read_text())
    shard = index["weight_map"]["shared.weight"]
    state = load_file(te / shard)
    state["encoder.embed_tokens.weight"] = state["shared.weight"] + 1
    save_file(state, te / shard, metadata={"format": "pt"})
    index["weight_map"]["encoder.embed_tokens.weight"] = shard
    (te / "model.safetensors.index.json").write_text(json.dumps(index))
    # When both paths load it
    ref = diffusers.WanPipeline.from_pretrained(str(folder), **quiet.dtype_kwargs(torch.bfloat16))
    pipe, _ = load_pipeline(folder, "WanPipeline", torch.bfloat16, torch.device("cpu"), 2)
    # Then each side keeps its stored value, untied, as from_pretrained leaves them
    for loaded in (ref.text_encoder, pipe.text_encoder):
        assert loaded.shared.weight is not loaded.encoder.embed_tokens.weight
    assert torch.equal(pipe.text_encoder.shared.weight, ref.text_encoder.shared.weight)
    assert torch.equal(pipe.text_encoder.encoder.embed_tokens.weight,
                       ref.text_encoder.encoder.embed_tokens.weight)


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_a_job_on_each_published_layout_equals_diffusers(
    published: dict[str, Path], images: dict[str, Path], tmp_path: Path, name: str
) -> None:
    folder, layout = published[name], PUBLISHED[name]
    h, w = SIZES.get(name, (32, 48))
    i2v = layout.pipeline == "WanImageToVideoPipeline" or name == "Wan2.2-TI2V-5B"
    image = {"image": images["png"].as_uri()} if i2v else {}
    gen = tiny_generate(folder, height=h, width=w, save_latents=True, **image)
    spec = JobSpec(job_id=f"pub-{name}", generate=gen, output=OutputSpec(uri=tmp_path.as_uri()),
                   video=VideoSpec(segment_frames=4))
    decoders = default_decoders(SETTINGS)  # the fast load path: the settings' default
    result = run_job(spec, decoders, Run(spec, settings=SETTINGS))
    assert result.manifest.latents_uri is not None
    z = load_file(result.manifest.latents_uri.removeprefix("file://"))["latents"]
    if image:
        sized = load_image(image["image"], "generate.image", w, h, "crop", SETTINGS).image
        # (TI2V's image-to-video runs through WanImageToVideoPipeline in diffusers too)
        assert torch.equal(z, reference_i2v_latents(gen, sized, dtype=torch.float32))
    else:
        assert torch.equal(z, reference_latents(gen, dtype=torch.float32))
    (entry,) = [decoders.models._entries[k] for k in decoders.models.keys()]
    assert entry.read_s > 0 and entry.load_s >= entry.read_s


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path, Settings]:
    inside, outside = tmp_path / "roots", tmp_path / "outside"
    inside.mkdir()
    outside.mkdir()
    return inside, outside, Settings(file_roots=str(inside))


def _copy(published: dict[str, Path], dest: Path) -> Path:
    return Path(shutil.copytree(published["Wan2.2-TI2V-5B"], dest))


def _refused(model: Path, settings: Settings, error: type[Exception] = InvalidJobError) -> str:
    with pytest.raises(error) as e:
        model_folder(model.as_uri(), settings)
    # fatal: a retry reads the same folder and fails the same way
    assert isinstance(e.value, FatalJobError) and not isinstance(e.value, RetryableError)
    return str(e.value)


def test_a_shard_the_index_does_not_name_is_refused(
    published: dict[str, Path], roots: tuple[Path, Path, Settings]
) -> None:
    inside, _, settings = roots
    model = _copy(published, inside / "m")
    stray = model / "transformer" / "diffusion_pytorch_model-00006-of-00006.safetensors"
    save_file({"w": torch.zeros(2)}, str(stray))
    text = _refused(model, settings)
    assert text == (f"generate.model: {model.as_uri()}/transformer/{stray.name} is a weights "
                    f"file that {model.as_uri()}/transformer/diffusion_pytorch_model.safetensors"
                    ".index.json does not name")


def test_an_index_naming_a_missing_shard_is_refused(
    published: dict[str, Path], roots: tuple[Path, Path, Settings]
) -> None:
    inside, _, settings = roots
    model = _copy(published, inside / "m")
    gone = "model-00002-of-00003.safetensors"
    (model / "text_encoder" / gone).unlink()
    text = _refused(model, settings)
    assert "text_encoder/model.safetensors.index.json names a shard" in text and gone in text


def test_a_shard_linked_out_of_the_roots_is_refused(
    published: dict[str, Path], roots: tuple[Path, Path, Settings]
) -> None:
    inside, outside, settings = roots
    model = _copy(published, inside / "m")
    shard = model / "transformer" / "diffusion_pytorch_model-00003-of-00005.safetensors"
    shutil.move(shard, outside / shard.name)
    shard.symlink_to(outside / shard.name)
    text = _refused(model, settings, PathRefusedError)
    assert "transformer/diffusion_pytorch_model-00003-of-00005.safetensors" in text


def test_a_tensor_its_shard_lacks_fails_the_load_naming_the_shard(
    published: dict[str, Path], roots: tuple[Path, Path, Settings]
) -> None:
    inside, _, settings = roots
    model = _copy(published, inside / "m")
    index_path = model / "vae" / "diffusion_pytorch_model.safetensors.index.json"
    # Given a VAE whose index maps a tensor to a shard that does not hold it
    single = model / "vae" / "diffusion_pytorch_model.safetensors"
    tensors = load_file(str(single))
    single.unlink()
    first = sorted(tensors)[0]
    save_file({k: v for k, v in tensors.items() if k != first},
              str(model / "vae" / "diffusion_pytorch_model-00001-of-00001.safetensors"))
    index_path.write_text(json.dumps({"weight_map": {
        k: "diffusion_pytorch_model-00001-of-00001.safetensors" for k in tensors}}))
    path = model_folder(model.as_uri(), settings)  # the header is not read by the check
    cache = ModelCache(torch.device("cpu"), 2**40)
    with pytest.raises(InvalidJobError, match=f"00001-of-00001.safetensors has no tensor "
                                              f"'{first}'"):
        cache.get(path, torch.float32)
    assert cache.keys() == []
