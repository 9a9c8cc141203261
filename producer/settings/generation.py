"""Generate jobs: step limits, the resident models, images and LoRA adapters."""

from __future__ import annotations

from pydantic import BaseModel, Field


class GenerationSettings(BaseModel):
    """Limits and caches of the denoise."""

    max_denoise_steps: int = Field(
        default=100, ge=1, le=10_000, description="reject generate jobs with more steps"
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
    text_encoder_offload: bool = Field(
        default=False,
        description="keep the text encoder on the CPU between jobs (frees its GPU memory; "
        "each job pays its host-to-device copy)",
    )
