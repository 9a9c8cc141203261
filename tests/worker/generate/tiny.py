"""A tiny random Wan pipeline on disk, and the reference the generate tests compare against."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from producer.wire.spec import GenerateSpec
from worker.generate.conditions.text import MAX_SEQUENCE_LENGTH
from worker.generate.denoise.loop import generator
from worker.generate.handoff import vae_latents
from worker.generate.model.presets import build_pipeline


@contextmanager
def threads(n: int) -> Iterator[None]:
    """torch's intra-op threads set to ``n`` for a reference computed here that must equal a
    worker's bit for bit: a CPU reduction split over another count of threads rounds
    otherwise (the tests' workers run with ``OMP_NUM_THREADS=1``)."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _dtype(dtype: torch.dtype | None) -> dict[str, object]:
    from worker import quiet

    return {} if dtype is None else quiet.dtype_kwargs(dtype)


def save_tiny_model(folder: Path, seed: int = 0, preset: str = "tiny") -> Path:
    """``save_pretrained`` of a tiny random Wan T2V pipeline: a tiny UMT5 encoder, a locally
    made tokenizer (``tokenizers``), a tiny transformer and VAE, and Wan2.1's UniPC scheduler
    (``preset``: ``tiny-ti2v`` / ``tiny-a14b`` for the Wan2.2 layouts)."""
    build_pipeline(preset, seed=seed).save_pretrained(folder)
    return folder


def without_transformer(model: Path, folder: Path) -> Path:
    """A copy of ``model`` whose transformer folder is gone."""
    shutil.copytree(model, folder)
    shutil.rmtree(folder / "transformer")
    return folder


def as_git_clone(model: Path, folder: Path, objects: int = 200,
                 lfs_bytes: int = 300 * 1024**2) -> Path:
    """A copy of ``model`` as ``git clone`` leaves it: ``.gitattributes`` on top, and a
    ``.git/`` with ``objects`` loose objects and a second copy of the transformer's weights as
    an LFS object (named by its hash, no extension), padded sparse to ``lfs_bytes``."""
    shutil.copytree(model, folder)
    (folder / ".gitattributes").write_text("*.safetensors filter=lfs diff=lfs merge=lfs -text\n")
    git = folder / ".git"
    for i in range(objects):
        loose = git / "objects" / f"{i % 256:02x}" / f"{i:038x}"
        loose.parent.mkdir(parents=True, exist_ok=True)
        loose.write_bytes(b"x\x9c" + bytes(64))  # zlib-headed, as git writes them
    lfs = git / "lfs" / "objects" / "ab" / "cd" / ("abcd" + "0" * 60)
    lfs.parent.mkdir(parents=True)
    shutil.copy(model / "transformer" / "diffusion_pytorch_model.safetensors", lfs)
    with lfs.open("r+b") as f:
        f.truncate(lfs_bytes)
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    return folder


def without(model: Path, folder: Path, component: str) -> Path:
    """A copy of ``model`` whose ``component`` folder is gone."""
    shutil.copytree(model, folder)
    shutil.rmtree(folder / component)
    return folder


def tiny_generate(model: Path, **kw: Any) -> GenerateSpec:
    fields: dict[str, Any] = {
        "model": model.as_uri(), "prompt": "a red fox in the snow", "height": 32, "width": 48,
        "num_frames": 9, "num_inference_steps": 2, "guidance_scale": 5.0, "seed": 7,
        "dtype": "float32",
    }
    return GenerateSpec(**{**fields, **kw})


@torch.no_grad()
def reference_latents(gen: GenerateSpec, dtype: torch.dtype | None = None) -> torch.Tensor:
    """diffusers alone: ``WanPipeline.from_pretrained`` (at ``dtype``, if given) + ``__call__``
    with the same prompt, steps and seed, ``output_type="latent"``, then the VAE-space
    latents (C, T, h, w)."""
    from diffusers import WanPipeline

    pipe = WanPipeline.from_pretrained(gen.model.removeprefix("file://"), **_dtype(dtype))
    pipe.set_progress_bar_config(disable=True)
    latents = pipe(
        prompt=gen.prompt, negative_prompt=gen.negative_prompt, height=gen.height,
        width=gen.width, num_frames=gen.num_frames, num_inference_steps=gen.num_inference_steps,
        guidance_scale=gen.guidance_scale, guidance_scale_2=gen.guidance_scale_2,
        generator=generator(gen), output_type="latent",
        max_sequence_length=MAX_SEQUENCE_LENGTH, return_dict=False,
    )[0]
    return vae_latents(pipe.vae, latents)


def make_lora(model: Path, path: Path, seed: int = 0, rank: int = 4,
              targets: tuple[str, ...] = ("to_q", "to_k", "to_v", "to_out.0")) -> Path:
    """A random LoRA for ``model``'s transformer, in diffusers' format (``transformer.``
    prefixed ``lora_A``/``lora_B`` weights), saved as ``.safetensors``."""
    from diffusers import WanTransformer3DModel
    from peft import LoraConfig, get_peft_model_state_dict
    from safetensors.torch import save_file

    transformer = WanTransformer3DModel.from_pretrained(model / "transformer")
    torch.manual_seed(seed)
    transformer.add_adapter(LoraConfig(r=rank, lora_alpha=rank, target_modules=list(targets),
                                       init_lora_weights=False))
    state = get_peft_model_state_dict(transformer)
    save_file({f"transformer.{k}": v.contiguous() for k, v in state.items()}, path)
    return path


@torch.no_grad()
def reference_lora_latents(gen: GenerateSpec, loras: list[tuple[Path, float]]) -> torch.Tensor:
    """diffusers alone with ``loras`` loaded (``load_lora_weights`` + ``set_adapters``)."""
    from diffusers import WanPipeline

    pipe = WanPipeline.from_pretrained(gen.model.removeprefix("file://"))
    pipe.set_progress_bar_config(disable=True)
    names = []
    for i, (path, _) in enumerate(loras):
        pipe.load_lora_weights(str(path), adapter_name=f"a{i}")
        names.append(f"a{i}")
    pipe.set_adapters(names, adapter_weights=[scale for _, scale in loras])
    latents = pipe(
        prompt=gen.prompt, negative_prompt=gen.negative_prompt, height=gen.height,
        width=gen.width, num_frames=gen.num_frames, num_inference_steps=gen.num_inference_steps,
        guidance_scale=gen.guidance_scale, generator=generator(gen), output_type="latent",
        max_sequence_length=MAX_SEQUENCE_LENGTH, return_dict=False,
    )[0]
    return vae_latents(pipe.vae, latents)


@torch.no_grad()
def reference_i2v_latents(gen: GenerateSpec, image: Any, last_image: Any = None,
                          dtype: torch.dtype | None = None) -> torch.Tensor:
    """diffusers alone: ``WanImageToVideoPipeline.from_pretrained`` on the same folder, the
    same (sized) image(s), prompt, steps and seed; VAE-space latents (C, T, h, w)."""
    from diffusers import WanImageToVideoPipeline

    pipe = WanImageToVideoPipeline.from_pretrained(gen.model.removeprefix("file://"),
                                                   **_dtype(dtype))
    pipe.set_progress_bar_config(disable=True)
    extra = {} if last_image is None else {"last_image": last_image}
    latents = pipe(
        image=image, prompt=gen.prompt, negative_prompt=gen.negative_prompt, height=gen.height,
        width=gen.width, num_frames=gen.num_frames, num_inference_steps=gen.num_inference_steps,
        guidance_scale=gen.guidance_scale, generator=generator(gen), output_type="latent",
        max_sequence_length=MAX_SEQUENCE_LENGTH, return_dict=False, **extra,
    )[0]
    return vae_latents(pipe.vae, latents)
