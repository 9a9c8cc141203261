"""Models by name: the one config file (``FRAMEFLEET_API_MODELS_FILE``) that maps a request's
``model`` to a server-side folder, its defaults and its limits.

A client names a model; it never names a path. ``size`` (``WxH``) and ``seconds`` become
width, height and frames by the model family's rules: Wan makes ``4k+1`` frames (``seconds ×
fps`` must be a multiple of 4; the first frame is extra) at sizes that are multiples of
``size_multiple`` (16: the VAE's 8× times the transformer's 2× patch; 32 for Wan2.2-TI2V-5B's
16× VAE). Anything else is a 400 naming the field.

Example (TOML)::

    [models.wan2.1-t2v-1.3b]
    folder = "/models/Wan2.1-T2V-1.3B-Diffusers"
    fps = 16
    size = "832x480"
    seconds = "5"
    steps = 50
    guidance = 5.0
    tier = "exact"
    [models.wan2.1-t2v-1.3b.limits]
    sizes = ["832x480", "480x832"]
    max_seconds = 10
    max_steps = 50
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from producer.api.config import load
from producer.errors import ApiRequestError, InvalidJobError
from producer.wire.reach import Reach, check_reach

SIZE_RE = re.compile(r"^([1-9][0-9]{0,4})x([1-9][0-9]{0,4})$")
NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$"
#: The longest ``max_seconds`` a model may have (``Limits``), and so any request's.
MAX_SECONDS = 3600


class Limits(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    sizes: tuple[str, ...] = Field(default=(), description="allowed WxH; empty: any in bounds")
    max_pixels: int = Field(default=1280 * 720, ge=64)
    max_seconds: float = Field(default=10.0, gt=0, le=MAX_SECONDS)
    max_steps: int = Field(default=50, ge=1, le=10_000)

    @field_validator("sizes")
    @classmethod
    def _sizes(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for s in v:
            if not SIZE_RE.match(s):
                raise ValueError(f"size {s!r} is not WxH")
        return v


class ModelEntry(BaseModel):
    """One model the API serves."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    folder: str = Field(description="local diffusers folder on the workers (path or file://)")
    family: Literal["wan"] = "wan"
    fps: float = Field(default=16.0, gt=0, le=240)
    size: str = Field(default="832x480", description="default WxH")
    seconds: str = Field(default="5", description="default duration")
    steps: int = Field(default=50, ge=1, le=10_000)
    guidance: float = Field(default=5.0, ge=0, le=100)
    guidance_2: float | None = Field(default=None, ge=0, le=100)
    tier: str = Field(default="exact", max_length=64,
                      description="the speed tier label the job's object carries")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    size_multiple: int = Field(default=16, ge=1, le=256)
    image_to_video: bool = Field(default=False, description="accepts input_reference")
    limits: Limits = Limits()

    @field_validator("folder")
    @classmethod
    def _folder(cls, v: str) -> str:
        path = v.removeprefix("file://")
        if not path.startswith("/") or ".." in Path(path).parts or "://" in path:
            raise ValueError(f"folder must be an absolute local path, got {v!r}")
        return Path(path).as_uri()

    @model_validator(mode="after")
    def _defaults_fit(self) -> ModelEntry:
        # The defaults must pass the entry's own rules, or every default request would 400.
        try:
            shape(self, None, None, None)
        except ApiRequestError as e:
            raise ValueError(f"the defaults break the entry's rules: {e.message}") from None
        return self


class Catalog(BaseModel):
    model_config = ConfigDict(extra="forbid")

    models: dict[str, ModelEntry] = Field(min_length=1)

    @field_validator("models")
    @classmethod
    def _names(cls, v: dict[str, ModelEntry]) -> dict[str, ModelEntry]:
        for name in v:
            if not re.match(NAME_RE, name):
                raise ValueError(f"model name {name!r} must match {NAME_RE}")
        return v

    def get(self, name: str | None) -> tuple[str, ModelEntry]:
        """The entry of ``name`` (the first listed when None), or a 400 naming ``model``."""
        if name is None:
            name = next(iter(self.models))
        entry = self.models.get(name)
        if entry is None:
            raise ApiRequestError(400, "unknown_model",
                                  f"model {name[:64]!r} is not served here (one of "
                                  f"{', '.join(sorted(self.models))})", "model")
        return name, entry


@dataclass(frozen=True)
class Shape:
    """What a request's size, seconds and steps become for one model."""

    width: int
    height: int
    frames: int
    size: str
    seconds: str
    steps: int


@dataclass(frozen=True)
class Fields:
    """What a request calls each quantity the model's limits cover: a 400 names it."""

    size: str
    frames: str
    steps: str
    image: str
    reach: tuple[str, str, str]  # width, height, frames against the model's positions


#: ``POST /v1/videos``: size, seconds and steps, and the upload.
VIDEO_FIELDS = Fields("size", "seconds", "steps", "input_reference", ("size", "size", "seconds"))
#: ``POST /v1/jobs``: the ``generate`` block of a JobSpec.
NATIVE_FIELDS = Fields("generate.width", "generate.num_frames", "generate.num_inference_steps",
                       "generate.image",
                       ("generate.width", "generate.height", "generate.num_frames"))


def _bad(param: str, message: str) -> ApiRequestError:
    return ApiRequestError(400, "invalid_value", f"{param}: {message}", param)


def check_limits(entry: ModelEntry, width: int, height: int, frames: int, steps: int,
                 image: bool, fields: Fields, reach: Reach | None = None) -> None:
    """The model's limits on one job: its sizes, pixels, duration, steps, whether it takes
    an image, and (``reach``: what its folder's configs say, where this host has it) how far
    its positions reach. The one check of both APIs (``/v1/videos`` after :func:`shape`,
    ``/v1/jobs`` on the parsed spec); a 400 names the request's own field."""
    limits, multiple, size = entry.limits, entry.size_multiple, f"{width}x{height}"
    if limits.sizes and size not in limits.sizes:
        raise _bad(fields.size, f"{size} is not one of this model's sizes: "
                   f"{', '.join(limits.sizes)}")
    if width % multiple or height % multiple:
        raise _bad(fields.size, f"{size}: width and height must be multiples of {multiple}")
    if width * height > limits.max_pixels:
        raise _bad(fields.size, f"{size} is over this model's {limits.max_pixels} pixels")
    # Exact: frames - 1 intervals at fps against max_seconds, without a float's rounding.
    if Decimal(frames - 1) > Decimal(str(limits.max_seconds)) * Decimal(str(entry.fps)):
        seconds = Decimal(frames - 1) / Decimal(str(entry.fps))
        raise _bad(fields.frames, f"{frames} frames ({seconds.normalize():f} s at {entry.fps:g} "
                   f"fps) are over this model's {limits.max_seconds:g} s")
    if not 1 <= steps <= limits.max_steps:
        raise _bad(fields.steps, f"{steps} is not in [1, {limits.max_steps}]")
    if image and not entry.image_to_video:
        raise _bad(fields.image, "this model takes no input image")
    if reach is not None:
        try:
            check_reach(reach, width, height, frames, fields.reach)
        except InvalidJobError as e:
            field = str(e).split(":", 1)[0]
            raise ApiRequestError(400, "invalid_value", str(e), field) from None


def shape(entry: ModelEntry, size: str | None, seconds: str | None,
          steps: int | None, image: bool = False, reach: Reach | None = None) -> Shape:
    """Map ``size``/``seconds``/``steps`` (None: the model's defaults) by its rules, then
    check them, and whether an ``image`` comes too, against its limits
    (:func:`check_limits`)."""
    size = entry.size if size is None else size.strip()
    match = SIZE_RE.match(size)
    if match is None:
        raise _bad("size", f"expected WIDTHxHEIGHT such as {entry.size}, got {size[:32]!r}")
    width, height = int(match[1]), int(match[2])
    text = entry.seconds if seconds is None else str(seconds).strip()
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise _bad("seconds", f"expected a number of seconds, got {text[:32]!r}") from None
    # A number, not the limit (check_limits has that): a bound so that "1e99999" never
    # becomes a frame count with a hundred thousand digits.
    if not value.is_finite() or value <= 0 or value > MAX_SECONDS:
        raise _bad("seconds", f"{text} is not a duration in (0, {MAX_SECONDS}] seconds")
    intervals = value * Decimal(str(entry.fps))
    if intervals != intervals.to_integral_value() or int(intervals) % 4:
        step = Decimal(4) / Decimal(str(entry.fps))
        raise _bad("seconds", f"{text} s at {entry.fps:g} fps: this model makes 4k+1 frames, "
                   f"so seconds must be a multiple of {step.normalize()}")
    n_steps = entry.steps if steps is None else steps
    frames = int(intervals) + 1
    check_limits(entry, width, height, frames, n_steps, image, VIDEO_FIELDS, reach)
    return Shape(width, height, frames, size, text, n_steps)


def load_catalog(path: str) -> Catalog:
    return load(path, Catalog, "FRAMEFLEET_API_MODELS_FILE")
