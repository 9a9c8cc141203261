"""The model-folder loader: every file walked, confined, regular, bounded, safetensors only,
configs within limits; refused before diffusers opens anything, naming the field and file."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
import torch

from producer.errors import InvalidJobError, PathRefusedError
from producer.settings import Settings
from producer.wire.spec import DecoderSpec
from tests.worker.generate.attacks import ATTACKS, attacked
from tests.worker.generate.tiny import as_git_clone, without
from worker.generate.model.cache import ModelCache
from worker.generate.model.presets import PRESETS, build_pipeline, save_configs
from worker.generate.request.folder import model_folder, read_model
from worker.generate.request.limits import check_config
from worker.inputs.weights import resolve_weights


@pytest.fixture
def place(tmp_path: Path) -> tuple[Path, Path, Settings]:
    """(the roots, a folder outside them, settings confining jobs to the roots)."""
    roots, outside = tmp_path / "roots", tmp_path / "outside"
    roots.mkdir()
    outside.mkdir()
    return roots, outside, Settings(file_roots=str(roots))


@pytest.mark.parametrize("name", list(ATTACKS))
def test_each_attack_is_refused_at_once_naming_field_and_file(
    name: str, tiny_model: Path, place: tuple[Path, Path, Settings]
) -> None:
    roots, outside, settings = place
    model, rel = attacked(tiny_model, roots / "m", outside, name)
    t0 = time.monotonic()
    with pytest.raises(InvalidJobError) as e:
        model_folder(model.as_uri(), settings)
    # Then the refusal names the field, the file (as sent) and what is wrong, in well under 1 s
    text = str(e.value)
    assert text.startswith("generate.model: ") and f"{model.as_uri()}/{rel}" in text, text
    assert ATTACKS[name][1] in text, text
    assert time.monotonic() - t0 < 1.0


def test_outside_refusal_is_the_same_whether_or_not_the_target_exists(
    tiny_model: Path, place: tuple[Path, Path, Settings]
) -> None:
    roots, outside, settings = place
    texts = []
    for i, target in enumerate((outside / "real.json", outside / "missing.json")):
        model = Path(shutil.copytree(tiny_model, roots / f"m{i}"))
        if i == 0:
            shutil.copy(model / "vae/config.json", target)
        (model / "vae/config.json").unlink()
        (model / "vae/config.json").symlink_to(target)
        with pytest.raises(PathRefusedError) as e:
            model_folder(model.as_uri(), settings)
        texts.append(str(e.value).replace(f"/m{i}/", "/m/"))
    assert texts[0] == texts[1]


def test_a_good_folder_passes_and_reads_the_same(
    tiny_model: Path, place: tuple[Path, Path, Settings]
) -> None:
    roots, _, settings = place
    model = Path(shutil.copytree(tiny_model, roots / "m"))
    link = roots / "link"  # a folder symlink inside the roots is followed, to its real path
    link.symlink_to(model, target_is_directory=True)
    path = model_folder(link.as_uri(), settings)
    assert path == model.resolve()
    assert read_model(path).pipeline == "WanPipeline"


def test_warm_up_model_skips_roots_but_nothing_else(
    tiny_model: Path, place: tuple[Path, Path, Settings]
) -> None:
    roots, outside, _ = place
    # Outside the roots is the operator's call (no settings: no roots)
    model, _ = attacked(tiny_model, outside / "warm", roots, "transformer folder outside")
    assert model_folder(str(model)) == model
    # but a device, a FIFO, a pickle or an absurd config are refused all the same
    for name, words in (("dev-zero vae config", "not a regular file"),
                        ("fifo scheduler config", "not a regular file"),
                        ("pickled text encoder", "pickle or zip checkpoint"),
                        ("100000 transformer layers", "FRAMEFLEET_MAX_MODEL_LAYERS")):
        bad, rel = attacked(tiny_model, outside / name.replace(" ", "-"), roots, name)
        with pytest.raises(InvalidJobError, match=words) as e:
            model_folder(str(bad))
        assert f"generate.model: {bad}/{rel}" in str(e.value)


def test_entry_bound_and_sharded_index_stay_inside(
    tiny_model: Path, place: tuple[Path, Path, Settings]
) -> None:
    roots, _, settings = place
    many = Path(shutil.copytree(tiny_model, roots / "many"))
    (many / "assets").mkdir()
    for i in range(40):
        (many / "assets" / f"{i}.txt").write_text("x")
    with pytest.raises(InvalidJobError, match="more than 30 files and folders"):
        model_folder(many.as_uri(), Settings(file_roots=str(roots), max_model_files=30))
    # A sharded index whose shard climbs out of its folder is refused
    sharded = Path(shutil.copytree(tiny_model, roots / "sharded"))
    weights = sharded / "vae/diffusion_pytorch_model.safetensors"
    weights.rename(sharded / "vae/shard.safetensors")
    (sharded / "vae/diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"w": "../transformer/diffusion_pytorch_model.safetensors"}}))
    with pytest.raises(InvalidJobError, match=r"index.json names a shard .*\.\./transformer"):
        model_folder(sharded.as_uri(), settings)


def test_config_over_limits_and_oversized_config(
    tiny_model: Path, place: tuple[Path, Path, Settings]
) -> None:
    roots, _, settings = place
    model = Path(shutil.copytree(tiny_model, roots / "m"))
    config = model / "scheduler/scheduler_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "pad": "x" * 5000}))
    with pytest.raises(InvalidJobError, match="FRAMEFLEET_MAX_MODEL_CONFIG_BYTES") as e:
        model_folder(model.as_uri(), Settings(file_roots=str(roots),
                                              max_model_config_bytes=4096))
    assert "scheduler/scheduler_config.json" in str(e.value)
    config.write_text(json.dumps({"num_train_timesteps": 10**9}))
    with pytest.raises(InvalidJobError, match="num_train_timesteps = 1000000000 is over"):
        model_folder(model.as_uri(), settings)


#: The published configs (diffusers layout) of the largest Wan models and their encoders.
WAN21_I2V_14B = {"num_attention_heads": 40, "attention_head_dim": 128, "in_channels": 36,
                 "out_channels": 16, "ffn_dim": 13824, "num_layers": 40, "text_dim": 4096,
                 "freq_dim": 256, "patch_size": [1, 2, 2], "rope_max_seq_len": 1024,
                 "image_dim": 1280, "added_kv_proj_dim": 5120, "pos_embed_seq_len": 514}
CLIP_H14 = {"hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 32,
            "num_attention_heads": 16, "image_size": 224, "patch_size": 14,
            "projection_dim": 1024, "num_channels": 3}
WAN22_VAE = PRESETS["wan2.2-ti2v-5b"].vae | {"dim_mult": [1, 2, 4, 4], "num_res_blocks": 2}
PUBLISHED = {"transformer": [WAN21_I2V_14B, PRESETS["wan2.1-t2v-1.3b"].transformer,
                             PRESETS["wan2.2-ti2v-5b"].transformer],
             "text": [PRESETS["wan2.1-t2v-1.3b"].text_encoder, CLIP_H14],
             "vae": [WAN22_VAE, {"base_dim": 96, "z_dim": 16, "dim_mult": [1, 2, 4, 4]}],
             "scheduler": [{"num_train_timesteps": 1000}]}


def test_defaults_admit_every_published_wan_and_nothing_a_thousand_times_larger() -> None:
    settings = Settings()
    for kind, configs in PUBLISHED.items():
        for config in configs:
            check_config(kind, config, settings, "generate.model: x")
            for key, value in config.items():
                if isinstance(value, int) and not isinstance(value, bool) and value > 1:
                    with pytest.raises(InvalidJobError, match=f"{key}|x"):
                        check_config(kind, {**config, key: value * 1000}, settings,
                                     "generate.model: x")


def test_model_cache_checks_again_before_loading(
    tiny_model: Path, place: tuple[Path, Path, Settings]
) -> None:
    roots, outside, settings = place
    model = Path(shutil.copytree(tiny_model, roots / "m"))
    path = model_folder(model.as_uri(), settings)
    # When, after the check, the transformer folder is swapped for a link out of the roots
    shutil.move(model / "transformer", outside / "t")
    (model / "transformer").symlink_to(outside / "t", target_is_directory=True)
    cache = ModelCache(torch.device("cpu"), 2**40)
    with pytest.raises(PathRefusedError, match="transformer is outside"):
        cache.get(path, torch.float32)
    assert cache.keys() == []


def test_decoder_weights_share_the_rule(tmp_path: Path) -> None:
    folder = tmp_path / "vae"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    torch.save({"w": torch.zeros(2)}, folder / "diffusion_pytorch_model.safetensors")
    spec = DecoderSpec(name="wan2.1-vae", weights=folder.as_uri())
    with pytest.raises(InvalidJobError, match="decoder.weights: .* is a pickle or zip checkpoint"):
        resolve_weights(spec, Settings(file_roots=str(tmp_path)))
    assert os.path.exists(folder / "diffusion_pytorch_model.safetensors")


def test_a_folder_of_configs_only_passes_once_its_pipeline_is_adopted(
    place: tuple[Path, Path, Settings]
) -> None:
    # Given a folder of configs only (what benchmarks write for a pipeline built in-process)
    roots, _, settings = place
    pipe = build_pipeline("tiny", "cpu", torch.float32)
    folder = save_configs(pipe, roots / "configs-only")
    # Then a job naming it is refused (no weights to load) …
    with pytest.raises(InvalidJobError, match="safetensors only"):
        model_folder(folder.as_uri(), settings)
    # … until the pipeline is resident: then the configs are still checked, no weights read
    ModelCache(torch.device("cpu"), 2**40).adopt(folder, pipe)
    assert model_folder(folder.as_uri(), settings) == folder.resolve()


def test_a_git_clone_passes_its_dot_folders_unread(
    tiny_model: Path, place: tuple[Path, Path, Settings]
) -> None:
    roots, outside, _ = place
    # Given a clone whose .git holds more entries than the limit, and a second copy of a
    # weight over the byte limit of non-weight files, plus a download cache
    clone = as_git_clone(tiny_model, roots / "clone", objects=200, lfs_bytes=8 * 1024**2)
    (clone / ".cache" / "huggingface").mkdir(parents=True)
    (clone / ".cache" / "huggingface" / "x.lock").write_bytes(b"")
    settings = Settings(file_roots=str(roots), max_model_files=50,
                        max_model_file_bytes=4 * 1024**2)
    # Then it passes, as the same folder without them does
    assert model_folder(clone.as_uri(), settings) == clone.resolve()
    assert read_model(clone).pipeline == "WanPipeline"
    # while the same files outside a dot-folder are counted and checked
    shutil.move(clone / ".git", clone / "git")
    with pytest.raises(InvalidJobError, match="more than 50 files and folders"):
        model_folder(clone.as_uri(), settings)
    shutil.rmtree(clone / "git")
    # and a link named like a dot-folder is confined like any link before it is skipped
    (clone / ".git").symlink_to(outside, target_is_directory=True)
    with pytest.raises(PathRefusedError, match=r"clone/\.git"):
        model_folder(clone.as_uri(), settings)
    (clone / ".git").unlink()
    (clone / ".git").symlink_to(roots, target_is_directory=True)
    assert model_folder(clone.as_uri(), settings) == clone.resolve()


def test_a_missing_tokenizer_is_named(tiny_model: Path, place: tuple[Path, Path, Settings],
                                      i2v_model: Path) -> None:
    roots, _, settings = place
    bare = without(tiny_model, roots / "no-tokenizer", "tokenizer")
    with pytest.raises(InvalidJobError) as e:
        model_folder(bare.as_uri(), settings)
    assert str(e.value) == (f"generate.model: {bare.as_uri()} has no tokenizer (tokenizer/ "
                            "missing; model_index.json names it)")
    empty = Path(shutil.copytree(tiny_model, roots / "empty-tokenizer"))
    (empty / "tokenizer" / "tokenizer.json").unlink()
    with pytest.raises(InvalidJobError, match=r"empty-tokenizer/tokenizer has no tokenizer.json "
                                              r"or spiece.model"):
        model_folder(empty.as_uri(), settings)
    processor = without(i2v_model, roots / "no-processor", "image_processor")
    with pytest.raises(InvalidJobError, match=r"has no image_processor \(image_processor/ "):
        model_folder(processor.as_uri(), settings)


def test_the_random_weights_marker_is_read_like_any_file_of_the_folder(
    tiny_model: Path, place: tuple[Path, Path, Settings]
) -> None:
    from worker.generate.model.tiny import RANDOM_MARKER

    roots, outside, settings = place
    model = Path(shutil.copytree(tiny_model, roots / "m"))
    assert not read_model(model_folder(model.as_uri(), settings)).random_weights  # none
    (model / RANDOM_MARKER).write_text('{"random_weights": false}')
    assert not read_model(model_folder(model.as_uri(), settings)).random_weights
    (model / RANDOM_MARKER).write_text('{"random_weights": true}')
    assert read_model(model_folder(model.as_uri(), settings)).random_weights
    (model / RANDOM_MARKER).write_text("noise")
    with pytest.raises(InvalidJobError, match=f"{RANDOM_MARKER} is not valid JSON"):
        read_model(model_folder(model.as_uri(), settings))
    # A marker that leads outside the roots is refused like any other file of the folder
    (outside / "marker.json").write_text('{"random_weights": true}')
    (model / RANDOM_MARKER).unlink()
    (model / RANDOM_MARKER).symlink_to(outside / "marker.json")
    with pytest.raises(PathRefusedError):
        model_folder(model.as_uri(), settings)
