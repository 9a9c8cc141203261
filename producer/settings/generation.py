"""Generate jobs: step limits, the resident models, images and LoRA adapters."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class GenerationSettings(BaseModel):
    """Limits and caches of the denoise."""

    max_denoise_steps: int = Field(
        default=100, ge=1, le=10_000, description="reject generate jobs with more steps"
    )
    preview_every: int = Field(
        default=2, ge=0, le=10_000,
        description="a preview after the first denoise step and every N-th one, for generate "
        "jobs that do not say (generate.preview); 0: none",
    )
    warmup_model: str | None = Field(
        default=None,
        description="local diffusers Wan folder (path or file:// URI) loaded when a worker "
        "starts and kept resident",
    )
    warmup_generate_sizes: str = Field(
        default="", pattern=r"^([0-9]{2,4}x[0-9]{2,4}x[0-9]{1,4}(,[0-9]{2,4}x[0-9]{2,4}x"
        r"[0-9]{1,4}){0,7})?$",
        description="CUDA: HxWxF video sizes (up to 8, comma-separated, e.g. 704x1280x121) the "
        "warm-up model's transformer is compiled for, at each of warmup_tiers, before the "
        "worker reports ready; empty: compiled by the first job of each size",
    )
    warmup_tiers: str = Field(
        default="exact", pattern=r"^(exact|fp8)(,(exact|fp8))?$",
        description="tiers (exact, fp8) the warm-up model is made resident and compiled at",
    )
    compiled_sizes: int = Field(
        default=4, ge=0, le=32,
        description="CUDA: video sizes each resident transformer keeps compiled; a job of "
        "another size beyond them runs eager (no recompile); 0: never compile",
    )
    max_image_bytes: int = Field(
        default=32 * 1024**2, ge=1024, le=1024**3,
        description="generate.image / last_image files larger than this are refused (counted "
        "while reading)",
    )
    max_image_pixels: int = Field(
        default=40_000_000, ge=64, le=1_000_000_000,
        description="decompression-bomb limit: images with more pixels (width x height, read "
        "from the header before decoding) are refused",
    )
    max_loras: int = Field(
        default=4, ge=0, le=16, description="LoRA adapters one generate job may name"
    )
    max_lora_bytes: int = Field(
        default=2 * 1024**3, ge=1024, le=64 * 1024**3,
        description="LoRA .safetensors files larger than this are refused",
    )
    lora_cache_mib: int = Field(
        default=4096, ge=1, le=1024**2,
        description="memory the loaded LoRA adapters of one resident model may hold; the least "
        "recently used are unloaded beyond it",
    )
    model_cache_gib: float = Field(
        default=80.0, gt=0, le=4096,
        description="GPU memory the resident generation models may hold; least recently "
        "used models are evicted beyond it",
    )
    load_method: Literal["fast", "diffusers"] = Field(
        default="fast",
        description="how a model folder is read: fast (safetensors shards straight to the "
        "device in load_threads threads, cast there; the same tensors as diffusers) or "
        "diffusers (from_pretrained on the host, then moved)",
    )
    load_threads: int = Field(
        default=8, ge=1, le=64,
        description="threads reading a model's safetensors shards in parallel (load_method "
        "fast)",
    )
    text_encoder_offload: bool = Field(
        default=False,
        description="keep the text encoder on the CPU between jobs (frees its GPU memory; "
        "each job pays its host-to-device copy)",
    )
    max_model_files: int = Field(
        default=10_000, ge=16, le=1_000_000,
        description="files and folders a generate model folder may hold (walked and checked "
        "before any is opened; dot-folders such as .git/ are skipped)",
    )
    max_model_config_bytes: int = Field(
        default=4 * 1024**2, ge=4096, le=256 * 1024**2,
        description="a model folder's JSON configs (model_index, component configs, scheduler, "
        "weight indexes) larger than this are refused (counted while reading)",
    )
    max_model_file_bytes: int = Field(
        default=256 * 1024**2, ge=4096, le=64 * 1024**3,
        description="a model folder's files other than .safetensors weights (tokenizer, "
        "processor, README) larger than this are refused",
    )
    max_model_layers: int = Field(
        default=128, ge=1, le=100_000,
        description="transformer blocks (num_layers) a model config may ask for (Wan: 30-40)",
    )
    max_model_heads: int = Field(
        default=256, ge=1, le=100_000,
        description="attention heads of a transformer, text or image encoder (Wan: 40, umT5: 64)",
    )
    max_model_dim: int = Field(
        default=65_536, ge=64, le=10_000_000,
        description="any width of a model config (hidden size, heads x head dim, ffn, channels, "
        "text/image dims; Wan2.1 14B: 13824 ffn, umT5-XXL: 10240 d_ff)",
    )
    max_model_channels: int = Field(
        default=1024, ge=16, le=1_000_000,
        description="channels, patch sizes, VAE factors and width multipliers of a model config "
        "(Wan: 48 latent channels at most, patches of 2, CLIP's 14)",
    )
    max_model_seq_len: int = Field(
        default=16_384, ge=64, le=10_000_000,
        description="rope_max_seq_len, position embeddings and attention buckets of a model "
        "config (Wan: 1024)",
    )
    max_text_layers: int = Field(
        default=96, ge=1, le=100_000,
        description="layers of the text encoder (umT5-XXL: 24) and CLIP image encoder (32)",
    )
    max_text_vocab: int = Field(
        default=1_048_576, ge=256, le=100_000_000,
        description="vocabulary of the text encoder (umT5: 256384)",
    )
    max_scheduler_timesteps: int = Field(
        default=100_000, ge=10, le=100_000_000,
        description="num_train_timesteps of a model's scheduler config (Wan: 1000)",
    )
