"""Wan pipelines with random weights at real or tiny sizes: for benchmarks, tests and demos.

The architectures are the published ones (diffusers-layout configs of Wan2.1-T2V-1.3B and
Wan2.2-TI2V-5B, UMT5-XXL text encoder); the weights are seeded random. ``tiny`` is the same
pipeline with a few channels, for CPU tests and the demo (``tiny-ti2v``, ``tiny-a14b`` and
``tiny-i2v``: the Wan2.2 TI2V, two-expert and Wan2.1 image-to-video layouts in miniature).
The tokenizer is built locally with the ``tokenizers`` library (characters as tokens): with
random weights only the sequence length matters, and no download is needed.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

UMT5_XXL: dict[str, Any] = {
    "vocab_size": 256_384, "d_model": 4096, "d_kv": 64, "d_ff": 10_240, "num_layers": 24,
    "num_heads": 64, "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128, "feed_forward_proj": "gated-gelu",
    "tie_word_embeddings": False, "layer_norm_epsilon": 1e-6,
}
UNIPC_FLOW: dict[str, Any] = {
    "prediction_type": "flow_prediction", "use_flow_sigmas": True,
    "num_train_timesteps": 1000,
}


@dataclass(frozen=True)
class Preset:
    """One pipeline's component configs (diffusers / transformers keyword arguments)."""

    name: str
    text_encoder: dict[str, Any]
    transformer: dict[str, Any]
    vae: dict[str, Any]
    scheduler: dict[str, Any]
    expand_timesteps: bool = False
    default_size: tuple[int, int, int] = (480, 832, 81)  # height, width, frames
    boundary_ratio: float | None = None  # set: a second expert (transformer_2), Wan2.2 A14B
    #: Wan2.1 I2V: a WanImageToVideoPipeline with this CLIP vision config (and its processor)
    image_encoder: dict[str, Any] | None = None
    i2v: bool = False  # a WanImageToVideoPipeline (image channels), with or without CLIP


PRESETS: dict[str, Preset] = {
    "wan2.1-t2v-1.3b": Preset(
        "wan2.1-t2v-1.3b", UMT5_XXL,
        {"num_attention_heads": 12, "attention_head_dim": 128, "in_channels": 16,
         "out_channels": 16, "ffn_dim": 8960, "num_layers": 30, "text_dim": 4096},
        {}, {**UNIPC_FLOW, "flow_shift": 3.0}, default_size=(480, 832, 81),
    ),
    "wan2.2-ti2v-5b": Preset(
        "wan2.2-ti2v-5b", UMT5_XXL,
        {"num_attention_heads": 24, "attention_head_dim": 128, "in_channels": 48,
         "out_channels": 48, "ffn_dim": 14_336, "num_layers": 30, "text_dim": 4096},
        # Wan2.2's VAE; latent statistics 0/1 (random weights: the real ones mean nothing)
        {"base_dim": 160, "decoder_base_dim": 256, "z_dim": 48, "in_channels": 12,
         "out_channels": 12, "patch_size": 2, "scale_factor_spatial": 16,
         "is_residual": True, "latents_mean": [0.0] * 48, "latents_std": [1.0] * 48},
        {**UNIPC_FLOW, "flow_shift": 5.0}, expand_timesteps=True,
        default_size=(704, 1280, 121),
    ),
    "tiny": Preset(
        "tiny",
        {"vocab_size": 128, "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2,
         "num_heads": 4, "relative_attention_num_buckets": 8, "feed_forward_proj": "gated-gelu",
         "tie_word_embeddings": False},
        {"num_attention_heads": 2, "attention_head_dim": 12, "in_channels": 16,
         "out_channels": 16, "ffn_dim": 32, "num_layers": 2, "text_dim": 32,
         "freq_dim": 256, "rope_max_seq_len": 32},
        {"base_dim": 8, "num_res_blocks": 1},
        {**UNIPC_FLOW, "flow_shift": 3.0}, default_size=(32, 48, 9),
    ),
}
_TINY = PRESETS["tiny"]
#: Wan2.2 TI2V's layout in miniature: 48 latent channels, a patchifying residual VAE (x16).
PRESETS["tiny-ti2v"] = Preset(
    "tiny-ti2v", _TINY.text_encoder, {**_TINY.transformer, "in_channels": 48, "out_channels": 48},
    {"base_dim": 8, "decoder_base_dim": 16, "z_dim": 48, "in_channels": 12, "out_channels": 12,
     "patch_size": 2, "scale_factor_spatial": 16, "is_residual": True, "num_res_blocks": 1,
     "latents_mean": [0.0] * 48, "latents_std": [1.0] * 48},
    {**UNIPC_FLOW, "flow_shift": 5.0}, expand_timesteps=True, default_size=(64, 64, 9),
)
#: Wan2.2 A14B's layout in miniature: two experts split at a boundary timestep.
PRESETS["tiny-a14b"] = Preset(
    "tiny-a14b", _TINY.text_encoder, _TINY.transformer, _TINY.vae, _TINY.scheduler,
    default_size=(32, 48, 9), boundary_ratio=0.875,
)


#: Wan2.1 I2V 14B's layout in miniature: image channels beside the noise (16 + 4 + 16) and a
#: CLIP image encoder whose embeddings the blocks attend to (diffusers' own test sizes).
PRESETS["tiny-i2v"] = Preset(
    "tiny-i2v", _TINY.text_encoder,
    {**_TINY.transformer, "in_channels": 36, "image_dim": 4, "added_kv_proj_dim": 24,
     "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads"},
    _TINY.vae, _TINY.scheduler, default_size=(32, 48, 9),
    image_encoder={"hidden_size": 4, "projection_dim": 4, "num_hidden_layers": 2,
                   "num_attention_heads": 2, "image_size": 32, "intermediate_size": 16,
                   "patch_size": 1},
)
#: Wan2.2 I2V A14B's layout in miniature: image channels, no image encoder, two experts.
PRESETS["tiny-i2v-a14b"] = Preset(
    "tiny-i2v-a14b", _TINY.text_encoder, {**_TINY.transformer, "in_channels": 36}, _TINY.vae,
    _TINY.scheduler, default_size=(32, 48, 9), boundary_ratio=0.9, i2v=True,
)
#: The layouts ``framefleet models tiny --layout`` writes.
LAYOUTS = {"t2v": "tiny", "ti2v": "tiny-ti2v", "i2v": "tiny-i2v"}


def make_tokenizer(vocab_size: int, max_length: int = 512) -> Any:
    """A T5-style fast tokenizer (pad 0, eos 1, unk 2; one token per character)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    chars = string.ascii_letters + string.digits + string.punctuation
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2}
    for ch in chars[: max(0, vocab_size - 3)]:
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", 1)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
        model_max_length=max_length,
    )


def cast(model: Any, dtype: torch.dtype) -> Any:
    """``model`` in ``dtype``, except what it keeps in float32 (``_keep_in_fp32_modules``):
    the same parameters in the same dtypes as ``from_pretrained(..., torch_dtype=dtype)``."""
    keep = getattr(model, "_keep_in_fp32_modules", None) or []
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_floating_point():
            fp32 = dtype != torch.float32 and any(k in name for k in keep)
            tensor.data = tensor.data.to(torch.float32 if fp32 else dtype)
    return model


def build_pipeline(
    preset: str, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> Any:
    """A ``WanPipeline`` of seeded random weights, initialised directly on ``device``.

    On CUDA nothing is built on the host first: UMT5-XXL alone is 5.7 B parameters.
    """
    from diffusers import (
        AutoencoderKLWan,
        UniPCMultistepScheduler,
        WanPipeline,
        WanTransformer3DModel,
    )
    from transformers import UMT5Config, UMT5EncoderModel

    p = PRESETS[preset]
    state = torch.random.get_rng_state()
    cuda_state = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    torch.manual_seed(seed)
    try:
        with torch.device(device):
            text_encoder = cast(UMT5EncoderModel(UMT5Config(**p.text_encoder)), dtype)
            transformer = cast(WanTransformer3DModel(**p.transformer), dtype)
            second = None
            if p.boundary_ratio is not None:
                second = cast(WanTransformer3DModel(**p.transformer), dtype).eval()
                second.requires_grad_(False)
            vae = cast(AutoencoderKLWan(**p.vae), dtype)
    finally:
        torch.random.set_rng_state(state)
        if cuda_state is not None:
            torch.cuda.set_rng_state_all(cuda_state)
    parts: dict[str, Any] = dict(
        tokenizer=make_tokenizer(p.text_encoder["vocab_size"]),
        text_encoder=text_encoder.eval().requires_grad_(False),
        vae=vae.eval().requires_grad_(False),
        scheduler=UniPCMultistepScheduler(**p.scheduler),
        transformer=transformer.eval().requires_grad_(False),
        transformer_2=second,
        boundary_ratio=p.boundary_ratio,
        expand_timesteps=p.expand_timesteps,
    )
    from diffusers import WanImageToVideoPipeline

    if p.image_encoder is None:
        return WanImageToVideoPipeline(**parts) if p.i2v else WanPipeline(**parts)
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    torch.manual_seed(seed + 1)
    with torch.device(device):
        encoder = cast(CLIPVisionModel(CLIPVisionConfig(**p.image_encoder)), dtype)
    size = p.image_encoder["image_size"]
    return WanImageToVideoPipeline(
        **parts, image_encoder=encoder.eval().requires_grad_(False),
        image_processor=CLIPImageProcessor(crop_size=size, size=size))


def save_configs(pipe: Any, folder: Path) -> Path:
    """Write a pipeline's configs (no weights) as a diffusers folder: what job validation reads.

    Benchmarks hand the built pipeline to the worker's model cache for this folder, so a job
    names it like any other model without gigabytes of random weights on disk.
    """
    folder.mkdir(parents=True, exist_ok=True)
    pipe.save_config(folder)
    pipe.transformer.save_config(folder / "transformer")
    if pipe.transformer_2 is not None:
        pipe.transformer_2.save_config(folder / "transformer_2")
    pipe.vae.save_config(folder / "vae")
    pipe.scheduler.save_config(folder / "scheduler")
    pipe.text_encoder.config.save_pretrained(folder / "text_encoder")
    pipe.tokenizer.save_pretrained(folder / "tokenizer")
    if getattr(pipe, "image_encoder", None) is not None:
        pipe.image_encoder.config.save_pretrained(folder / "image_encoder")
        pipe.image_processor.save_pretrained(folder / "image_processor")
    return folder
