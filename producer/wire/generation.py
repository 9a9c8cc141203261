"""The ``generate`` request of a job: a prompt (and its speed settings) instead of latents.

Re-exported by ``producer.wire.spec``. The speed settings are labelled, never silent: a job runs at
the ``tier`` and with the step ``cache`` it asked for, and the manifest, the result, the cost
report and the metrics say which.

- ``tier``: ``exact`` (the default: the model's own modules in the job's dtype, compiled
  regionally on CUDA, one forward within 2e-2 relative L2 of eager) or ``fp8`` (torchao's
  dynamic float8 per-row quantisation of the transformer's linear layers; GPUs of compute
  capability 8.9 or more only: elsewhere the job fails at once, naming ``generate.tier``).
- ``cache``: none by default, or one of diffusers' step caches (First-Block-Cache, TaylorSeer,
  MagCache), with its parameters. A MagCache needs the model's calibration ratios.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal
from urllib.parse import urlparse

from pydantic import (
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from producer.wire.base import Frozen, check_uri

#: The precision tiers a generate job can ask for.
Tier = Literal["exact", "fp8"]
TIERS: tuple[str, ...] = ("exact", "fp8")


class FirstBlockCache(Frozen):
    """diffusers' First-Block-Cache: the remaining blocks are skipped while the first block's
    residual changes by less than ``threshold`` (relative mean absolute difference)."""

    kind: Literal["first_block"]
    threshold: StrictFloat = Field(default=0.05, gt=0, le=1)


class TaylorSeerCache(Frozen):
    """diffusers' TaylorSeer (its lite mode): a full forward every ``cache_interval`` steps; in
    the steps between, the blocks are skipped and the output projection is predicted by a
    Taylor expansion of order ``max_order``."""

    kind: Literal["taylorseer"]
    cache_interval: StrictInt = Field(default=5, ge=1, le=100)
    disable_cache_before_step: StrictInt = Field(default=3, ge=0, le=10_000)
    disable_cache_after_step: StrictInt | None = Field(default=None, ge=0, le=10_000)
    max_order: StrictInt = Field(default=1, ge=0, le=4)


#: How a MagCache's ratios are measured (the README's "Step caches" shows the whole command).
CALIBRATE_HINT = ("calibrate the model with `python -m worker calibrate-magcache --model DIR "
                  "--steps N` and pass the printed ratios as mag_ratios")


class MagCache(Frozen):
    """diffusers' MagCache: steps are skipped while the accumulated error of the model's
    calibrated magnitude ratios stays under ``threshold``. ``mag_ratios`` are the model's
    (and scheduler's): without them the job is refused."""

    kind: Literal["mag"]
    threshold: StrictFloat = Field(default=0.06, gt=0, le=10)
    max_skip_steps: StrictInt = Field(default=3, ge=1, le=100)
    retention_ratio: StrictFloat = Field(default=0.2, ge=0, le=1)
    mag_ratios: tuple[StrictFloat, ...] = Field(
        min_length=2, max_length=1000,
        description="the model's calibration ratios, one per step of the calibration run",
    )

    @model_validator(mode="before")
    @classmethod
    def _ratios(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("mag_ratios"):
            raise ValueError(f"a MagCache needs the model's mag_ratios; {CALIBRATE_HINT}")
        return data


class LoraSpec(Frozen):
    """A LoRA adapter for one job: a ``.safetensors`` file (``file://`` inside the worker's
    roots, or ``s3://``) at ``scale``. ``expert`` picks the transformer of a two-expert model
    (Wan2.2 A14B): ``high_noise`` (``transformer``), ``low_noise`` (``transformer_2``) or
    ``both``; one-expert models take ``both`` (their only transformer)."""

    uri: str
    scale: StrictFloat = Field(default=1.0, ge=-10, le=10)
    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._-]{1,64}$",
                             description="a label for logs and the manifest")
    expert: Literal["both", "high_noise", "low_noise"] = "both"

    @field_validator("uri")
    @classmethod
    def _uri(cls, v: str) -> str:
        check_uri(v, field="lora.uri")
        if not urlparse(v).path.endswith(".safetensors"):
            raise ValueError(f"a LoRA is a .safetensors file, got {v!r}")
        return v


class PreviewSpec(Frozen):
    """Previews while the job denoises: after step 1, then one every ``every`` steps (after
    steps N, 2N, …), a small MP4 of the model's current estimate of the video under
    ``previews/``; 0: none. An ``every`` over the job's steps leaves the one after step 1 (no
    bound between two fields: the OpenAPI schema can say every rule a request keeps)."""

    every: StrictInt = Field(ge=0, le=10_000)


#: How an input image becomes the job's frame size (``generate.image_resize``).
ImageResize = Literal["crop", "pad", "stretch"]


#: One of diffusers' step caches, told apart by ``kind``.
CacheSpec = Annotated[FirstBlockCache | TaylorSeerCache | MagCache, Field(discriminator="kind")]


class GenerateSpec(Frozen):
    """Denoise latents on the worker from a prompt (instead of loading them: ``input``).

    The model is a local diffusers folder of a Wan pipeline (Wan2.1 T2V 1.3B/14B, Wan2.2 A14B
    with two experts, Wan2.2 TI2V-5B). What depends on the model (the size's multiple, whether
    it has a second expert or a flow shift) is checked by the worker against the folder's
    configs; the limits on steps and size come from the worker's settings.
    """

    model: str = Field(description="file:// URI of a local diffusers folder (model_index.json)")
    prompt: str = Field(min_length=1, max_length=20_000)
    negative_prompt: str = Field(default="", max_length=20_000)
    height: StrictInt = Field(default=480, ge=16, le=4096)
    width: StrictInt = Field(default=832, ge=16, le=4096)
    num_frames: StrictInt = Field(default=81, ge=1, le=100_000, description="4k+1 frames")
    num_inference_steps: StrictInt = Field(default=50, ge=1, le=10_000)
    guidance_scale: StrictFloat = Field(default=5.0, ge=0, le=100, description="> 1: CFG on")
    guidance_scale_2: StrictFloat | None = Field(
        default=None, ge=0, le=100, description="second (low-noise) expert; two-expert models"
    )
    boundary_ratio: StrictFloat | None = Field(
        default=None, gt=0, lt=1,
        description="two-expert models: share of the timesteps for the first expert; "
        "default: the model's",
    )
    flow_shift: StrictFloat | None = Field(
        default=None, gt=0, le=100, description="scheduler flow shift; default: the model's"
    )
    seed: StrictInt = Field(default=0, ge=0, le=2**63 - 1)
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        default="auto", description="auto: bfloat16 on CUDA, float32 on CPU"
    )
    save_latents: StrictBool = Field(
        default=False, description="also write latents.safetensors beside the segments"
    )
    tier: Tier = Field(
        default="exact",
        description="exact: the model's modules, compiled on CUDA (within 2e-2 rel L2 of eager "
        "per forward); fp8: float8 per-row quantised linear layers (compute capability >= 8.9)",
    )
    cache: CacheSpec | None = Field(
        default=None, description="a diffusers step cache and its parameters; None: every step "
        "runs every block",
    )
    image: str | None = Field(
        default=None, description="image-to-video: the first frame, a PNG, JPEG or WebP "
        "(file:// inside the worker's roots, or s3://)")
    last_image: str | None = Field(
        default=None, description="the last frame, for models that take one (Wan I2V 14B)")
    image_resize: ImageResize = Field(
        default="crop", description="how the image meets height x width: crop (scale to cover, "
        "centre crop; the default), pad (scale to fit, black bars) or stretch")
    loras: tuple[LoraSpec, ...] = Field(
        default=(), max_length=16, description="LoRA adapters and their scales (the worker's "
        "FRAMEFLEET_MAX_LORAS bounds them)")
    preview: PreviewSpec | None = Field(
        default=None, description="previews while denoising; None: the worker's "
        "FRAMEFLEET_PREVIEW_EVERY (every 2 steps unless its operator says)")

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        check_uri(v, field="generate.model")
        if urlparse(v).scheme != "file":
            raise ValueError(f"generate.model: a local folder (file:///...), got {v!r}")
        return v

    @field_validator("num_frames")
    @classmethod
    def _frames(cls, v: int) -> int:
        if v % 4 != 1:
            raise ValueError(f"num_frames must be 4k+1 (1, 5, 9, … 81), got {v}")
        return v

    @field_validator("image", "last_image")
    @classmethod
    def _image(cls, v: str | None, info: ValidationInfo) -> str | None:
        return None if v is None else check_uri(v, field=f"generate.{info.field_name}")

    @model_validator(mode="after")
    def _fp8_dtype(self) -> GenerateSpec:
        if self.tier == "fp8" and self.dtype not in ("auto", "bfloat16"):
            raise ValueError(f"tier fp8 runs bfloat16 activations; dtype {self.dtype!r} "
                             "cannot (leave dtype auto)")
        if self.last_image is not None and self.image is None:
            raise ValueError("last_image needs an image (the first frame)")
        if self.loras and self.tier == "fp8":
            raise ValueError("loras run on the exact tier (peft does not wrap torchao's float8 "
                             "layers)")
        return self

    def speed_label(self) -> str:
        """``exact``, ``fp8``, ``exact+first_block`` …: the tier and cache, as one label."""
        return self.tier if self.cache is None else f"{self.tier}+{self.cache.kind}"


#: ``generate`` fields added to schema 1 later, with the value that leaves them out of the
#: digest: a spec that does not use them keeps the digest it always had.
GENERATE_DEFAULTS: dict[str, Any] = {"tier": "exact", "cache": None, "image": None,
                                     "last_image": None, "image_resize": "crop", "loras": (),
                                     "preview": None}


def unset_generate_fields(gen: GenerateSpec) -> set[str]:
    """The later ``generate`` fields at their defaults (left out of ``JobSpec.digest``)."""
    return {name for name, default in GENERATE_DEFAULTS.items()
            if getattr(gen, name) == default}
