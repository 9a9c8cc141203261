"""THE wire format: every message between producer and worker is one of these frozen models.

JSON only (pickle is never accepted). Validation rejects bad values with a message naming the
field; ``parse_spec`` turns pydantic's errors into one :class:`InvalidJobError` line per field.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from typing import Any, Literal
from urllib.parse import urlparse

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from producer.errors import InvalidJobError

#: Identifiers that become object-key components: no slash, no "." / ".." (path traversal).
ID_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
SCHEMA_VERSION: Literal[1] = 1
#: JobResult's own version. 2: the ten fields a result shared with its manifest moved into
#: ``JobResult.manifest`` (read ``result.manifest.frames``, not ``result.frames``).
RESULT_SCHEMA_VERSION: Literal[2] = 2
#: Where a job's time goes, in pipeline order: ``StageTimings`` has one ``{stage}_s`` field per
#: name, the worker pipeline measures every one but ``load``, and metrics label by them.
STAGE_NAMES: tuple[str, ...] = (
    "load", "text_encode", "denoise", "decode", "postprocess", "d2h", "encode", "upload",
)
#: ``DecoderSpec.weights`` that asks for a seeded random init: the output is noise, and the
#: manifest and the result say so (``random_weights``).
RANDOM_WEIGHTS = "random"


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def check_id(value: str, field: str) -> str:
    if not ID_RE.fullmatch(value) or value in {".", ".."}:
        raise ValueError(f"{field} must match [A-Za-z0-9._-]{{1,128}} and not be '.' or '..'")
    return value


def check_uri(value: str, *, field: str) -> str:
    """Accept ``s3://bucket/key`` or ``file:///absolute/path``; refuse ``..`` segments."""
    parsed = urlparse(value)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"{field}: s3 URI needs a bucket: {value!r}")
    elif parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            raise ValueError(f"{field}: file URI must be absolute (file:///...): {value!r}")
    else:
        hint = " (a local path is written file:///absolute/path)" if not parsed.scheme else ""
        raise ValueError(f"{field}: scheme must be s3:// or file://, got {value!r}{hint}")
    if any(part in {"..", "."} for part in parsed.path.split("/")):
        raise ValueError(f"{field}: '.' and '..' path segments are not allowed: {value!r}")
    return value


class InputSpec(Frozen):
    """Where the latents are: one tensor (C, T, H, W) or (1, C, T, H, W) in VAE latent space."""

    uri: str
    format: Literal["safetensors", "npy"] | None = Field(
        default=None, description="inferred from the extension when omitted"
    )
    tensor: str | None = Field(
        default=None, description="tensor name inside a .safetensors file (default: the only one)"
    )

    @field_validator("uri")
    @classmethod
    def _uri(cls, v: str) -> str:
        return check_uri(v, field="input.uri")

    @property
    def resolved_format(self) -> Literal["safetensors", "npy"]:
        if self.format is not None:
            return self.format
        path = urlparse(self.uri).path
        if path.endswith(".safetensors"):
            return "safetensors"
        if path.endswith(".npy"):
            return "npy"
        raise InvalidJobError(
            f"input.format: cannot infer from {self.uri!r}; use .safetensors or .npy"
        )


class DecoderSpec(Frozen):
    """Which decoder turns latents into frames."""

    name: Literal["wan2.1-vae", "wan2.2-vae", "pattern"] = "wan2.1-vae"
    weights: str | None = Field(
        default=None,
        description="diffusers-layout folder (file://) of the decoder's model, or \"random\": "
        "a seeded random init that decodes to noise (tests, demos); the Wan decoders need one "
        "of the two, the pattern decoder neither",
    )
    preset: Literal["auto", "wan2.1", "tiny", "wan2.2", "tiny-wan2.2"] = Field(
        default="auto", validate_default=True,
        description="architecture config; auto: the decoder's own (wan2.1-vae: wan2.1, "
        "wan2.2-vae: wan2.2 = TI2V-5B's VAE); the tiny ones are for tests and demos",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="auto: bfloat16 on CUDA, float32 on CPU"
    )
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="seed of the random init")

    @field_validator("weights")
    @classmethod
    def _weights(cls, v: str | None) -> str | None:
        return v if v is None or v == RANDOM_WEIGHTS else check_uri(v, field="decoder.weights")

    @field_validator("preset")
    @classmethod
    def _preset(cls, v: str, info: ValidationInfo) -> str:
        name = info.data.get("name", "wan2.1-vae")
        presets = DECODER_PRESETS.get(name, ("wan2.1",))
        if v == "auto":
            return presets[0]
        if name in DECODER_PRESETS and v not in presets:
            raise ValueError(f"{v!r} is not an architecture of {name} (one of {presets})")
        return v


#: Presets per decoder, its default first. A Wan2.2 A14B job uses wan2.1-vae.
DECODER_PRESETS = {"wan2.1-vae": ("wan2.1", "tiny"), "wan2.2-vae": ("wan2.2", "tiny-wan2.2")}
#: A decoder's model's frame rate: a job's video.fps when it gives none (Wan2.2-5B: 24).
DECODER_FPS = {"wan2.2-vae": 24.0}


class VideoSpec(Frozen):
    """How frames become MP4 segments."""

    fps: float = Field(default=16.0, gt=0, le=240)
    codec: Literal["libx264", "h264_nvenc"] = "libx264"
    crf: int = Field(default=20, ge=0, le=51)
    preset: Literal[
        "ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower"
    ] = "veryfast"
    segment_frames: int = Field(default=48, ge=1, le=100_000)
    first_segment_frames: int | None = Field(
        default=None, ge=1, le=100_000,
        description="frames of the first segment only (fewer: the live stream starts sooner); "
        "None: segment_frames",
    )
    tune: Literal["zerolatency", "none", "film", "animation"] = Field(
        default="zerolatency",
        description="x264 tune; zerolatency keeps no frames buffered, so a job's encode tail "
        "after its last decoded chunk (GPU time paid for nothing) is a few ms",
    )
    stitch: bool = Field(default=False, description="also write full.mp4 (all segments)")


def segment_name(index: int) -> str:
    """File name of segment ``index`` in a job's output folder (and in the worker's scratch)."""
    return f"segment-{index:05d}.mp4"


class OutputSpec(Frozen):
    """Final keys: ``{uri}/{tenant}/{job_id}/segment-00000.mp4 … manifest.json``
    (see :func:`segment_name`)."""

    uri: str

    @field_validator("uri")
    @classmethod
    def _uri(cls, v: str) -> str:
        return check_uri(v.rstrip("/") or v, field="output.uri").rstrip("/")


class GenerateSpec(Frozen):
    """Denoise latents on the worker from a prompt (instead of loading them: ``input``).

    The model is a local diffusers folder of a Wan text-to-video pipeline (Wan2.1 T2V 1.3B/14B,
    Wan2.2 A14B with two experts, Wan2.2 TI2V-5B). What depends on the model (the size's
    multiple, whether it has a second expert or a flow shift) is checked by the worker against
    the folder's configs; the limits on steps and size come from the worker's settings.
    """

    model: str = Field(description="file:// URI of a local diffusers folder (model_index.json)")
    prompt: str = Field(min_length=1, max_length=20_000)
    negative_prompt: str = Field(default="", max_length=20_000)
    height: int = Field(default=480, ge=16, le=4096)
    width: int = Field(default=832, ge=16, le=4096)
    num_frames: int = Field(default=81, ge=1, le=100_000, description="4k+1 frames")
    num_inference_steps: int = Field(default=50, ge=1, le=10_000)
    guidance_scale: float = Field(default=5.0, ge=0, le=100, description="> 1: CFG on")
    guidance_scale_2: float | None = Field(
        default=None, ge=0, le=100, description="second (low-noise) expert; two-expert models"
    )
    boundary_ratio: float | None = Field(
        default=None, gt=0, lt=1,
        description="two-expert models: share of the timesteps for the first expert; "
        "default: the model's",
    )
    flow_shift: float | None = Field(
        default=None, gt=0, le=100, description="scheduler flow shift; default: the model's"
    )
    seed: int = Field(default=0, ge=0, le=2**63 - 1)
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        default="auto", description="auto: bfloat16 on CUDA, float32 on CPU"
    )
    save_latents: bool = Field(
        default=False, description="also write latents.safetensors beside the segments"
    )

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


class PipelineSpec(Frozen):
    mode: Literal["async", "sequential"] = "async"
    ring_slots: int = Field(default=3, ge=2, le=16)
    encoder_threads: int | None = Field(
        default=None, ge=1, le=16, description="segment encoders in flight; None: from CPU count"
    )


#: What a job can notify: it started, a segment joined the live playlist, it ended.
NotifyEvent = Literal["started", "segment", "succeeded", "failed", "cancelled"]


class NotifySpec(Frozen):
    """Webhooks of one job: POSTs of signed JSON to ``urls`` for each of ``events``.

    Only the URL's form is checked here; the fleet's allow-list (producer/webhooks.py) is
    applied at submit and again, after DNS, by the worker that delivers.
    """

    urls: tuple[str, ...] = Field(min_length=1, max_length=8)
    events: tuple[NotifyEvent, ...] = Field(
        default=("succeeded", "failed", "cancelled"), min_length=1
    )

    @field_validator("urls")
    @classmethod
    def _urls(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for i, url in enumerate(v):
            parsed = urlparse(url)
            if parsed.scheme not in ("http", "https") or not parsed.hostname:
                raise ValueError(f"notify.urls[{i}]: expected an http(s):// URL, got {url!r}")
            if len(url) > 2048:
                raise ValueError(f"notify.urls[{i}]: longer than 2048 characters")
        return v


class JobSpec(Frozen):
    """One video job, as the producer submits it."""

    schema_version: Literal[1] = SCHEMA_VERSION
    job_id: str
    tenant: str = "default"
    input: InputSpec | None = None
    generate: GenerateSpec | None = None
    decoder: DecoderSpec = DecoderSpec()
    video: VideoSpec = Field(default_factory=VideoSpec, validate_default=True)
    output: OutputSpec
    pipeline: PipelineSpec = PipelineSpec()
    priority: int = Field(default=5, ge=0, le=9, description="9 is the most urgent")
    time_limit_s: int = Field(default=3600, ge=1, le=86_400)
    notify: NotifySpec | None = Field(default=None, description="webhooks; None: none")

    @field_validator("video")
    @classmethod
    def _model_fps(cls, v: VideoSpec, info: ValidationInfo) -> VideoSpec:
        decoder = info.data.get("decoder")
        fps = DECODER_FPS.get(decoder.name) if decoder is not None else None
        if fps is None or "fps" in v.model_fields_set:
            return v
        return v.model_copy(update={"fps": fps})

    @field_validator("job_id")
    @classmethod
    def _job_id(cls, v: str) -> str:
        return check_id(v, "job_id")

    @field_validator("tenant")
    @classmethod
    def _tenant(cls, v: str) -> str:
        return check_id(v, "tenant")

    @model_validator(mode="after")
    def _one_source(self) -> JobSpec:
        if (self.input is None) == (self.generate is None):
            raise ValueError("input, generate: give exactly one of them (latents or a prompt)")
        if self.generate is not None and self.decoder != DecoderSpec():
            raise ValueError("decoder: a generate job decodes with its model's own VAE; "
                             "leave decoder out")
        return self

    def digest(self) -> str:
        """sha256 of the canonical JSON: two submissions of one job_id must carry the same."""
        canonical = json.dumps(self.model_dump(mode="json", exclude=_unset_additions(self)),
                               sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def output_prefix(self) -> str:
        return f"{self.output.uri}/{self.tenant}/{self.job_id}"


def _unset_additions(spec: JobSpec) -> dict[str, Any]:
    """Fields added to schema 1 later, left out of the digest while unset: a spec that does
    not use them keeps the digest it always had (reruns still match their manifests)."""
    exclude: dict[str, Any] = {}
    if spec.notify is None:
        exclude["notify"] = True
    if spec.generate is None:
        exclude["generate"] = True
    if spec.video.first_segment_frames is None:
        exclude["video"] = {"first_segment_frames"}
    return exclude


def parse_spec(data: Any) -> JobSpec:
    """Validate a JobSpec from a dict or JSON text; errors name every bad field."""
    try:
        if isinstance(data, (str, bytes)):
            return JobSpec.model_validate_json(data)
        return JobSpec.model_validate(data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = ".".join(str(p) for p in err["loc"]) or "spec"
            lines.append(f"{loc}: {err['msg']}")
        raise InvalidJobError("invalid job spec: " + "; ".join(lines)) from None


class Progress(Frozen):
    """Payload of the Celery custom state ``PROGRESS``: denoise steps first (generate jobs),
    then frames."""

    frames_done: int
    frames_total: int
    segments_done: int
    stage: Literal["denoise", "decode"] = "decode"
    steps_done: int = 0
    steps_total: int = 0

    @property
    def text(self) -> str:
        """``denoise 12/50`` while denoising, then ``120/121 frames``."""
        if self.stage == "denoise":
            return f"denoise {self.steps_done}/{self.steps_total}"
        return f"{self.frames_done}/{self.frames_total} frames"


class SegmentInfo(Frozen):
    index: int
    uri: str
    first_frame: int
    frames: int
    bytes: int
    sha256: str
    seconds: float = Field(description="video duration of the segment")


class StageTimings(Frozen):
    """Seconds spent per stage. Stages overlap in async mode, so they do not add up to wall."""

    load_s: float = 0.0
    text_encode_s: float = Field(default=0.0, description="generate jobs: prompt encoding")
    denoise_s: float = Field(default=0.0, description="generate jobs: the denoising loop")
    decode_s: float = 0.0
    postprocess_s: float = 0.0
    d2h_s: float = 0.0
    encode_s: float = 0.0
    upload_s: float = 0.0
    backpressure_s: float = Field(default=0.0, description="main thread waiting for a free slot")
    wall_s: float = 0.0
    gpu_busy_ratio: float | None = Field(
        default=None, description="summed decode time over the decode window (CUDA only)"
    )


def check_stage_fields(fields: Iterable[str], owner: str, skip: tuple[str, ...] = ()) -> None:
    """Raise unless ``fields`` has a ``{stage}_s`` for every stage of :data:`STAGE_NAMES` but
    ``skip``: the records that spell stages as fields cannot drift from the one list."""
    have = set(fields)
    missing = [s for s in STAGE_NAMES if s not in skip and f"{s}_s" not in have]
    if missing:
        raise TypeError(f"{owner} has no field for stages {missing} of STAGE_NAMES")


check_stage_fields(StageTimings.model_fields, "StageTimings")


class WorkerInfo(Frozen):
    hostname: str
    node: str
    pid: int
    device: str
    gpu_name: str | None = None
    gpu_uuid: str | None = None


class Prices(Frozen):
    """The prices a CostReport used, with where each came from."""

    instance_type: str
    region: str
    capacity: Literal["on-demand", "spot"]
    instance_usd_per_hour: float
    gpus_per_instance: int
    s3_put_usd_per_1000: float
    s3_storage_usd_per_gb_month: float
    sources: tuple[str, ...] = ()


class StageCost(Frozen):
    """One stage's part of a job's cost: GPU-seconds held (none for s3), $ and share of total."""

    stage: str
    gpu_seconds: float
    usd: float
    share: float


class HeldRun(Frozen):
    """GPU time a run held without a JobResult (it failed, was retried, requeued or
    cancelled): the worker writes one per such run, ``framefleet cost report`` adds them up.

    ``reason`` is the error's class (``producer.errors``); ``prices`` is None when the worker's
    prices could not be read (a broken pricing file is itself a reason to fail).
    """

    job_id: str
    tenant: str
    status: Literal["failure", "retry", "requeue", "cancelled"]
    reason: str
    node: str
    device: str
    started_at: float = Field(description="unix time the run started")
    finished_at: float = Field(description="unix time the run ended")
    gpu_seconds: float = Field(ge=0)
    prices: Prices | None = None


class CostReport(Frozen):
    """Direct cost-to-serve of one job: its GPU time, S3 requests and storage, at ``prices``."""

    tenant: str
    prices: Prices
    gpu_seconds: float
    gpu_usd: float
    s3_puts: int
    s3_put_usd: float
    stored_bytes: int
    storage_usd_per_month: float
    total_usd: float
    video_seconds: float
    usd_per_video_minute: float
    usd_per_1000_video_hours: float
    stages: tuple[StageCost, ...] = Field(
        default=(), description="text_encode, denoise, decode (GPU) and s3: each with its share"
    )


class Manifest(Frozen):
    """``manifest.json``: written LAST, so its presence means every segment is in place."""

    schema_version: Literal[1] = SCHEMA_VERSION
    job_id: str
    tenant: str
    spec_digest: str
    frames: int
    width: int
    height: int
    fps: float
    video_seconds: float
    segments: tuple[SegmentInfo, ...]
    full_uri: str | None = None
    playlist_uri: str | None = Field(default=None, description="the live HLS playlist")
    latents_uri: str | None = Field(default=None, description="generate.save_latents")
    random_weights: bool = Field(
        default=False, description="decoded with random weights (decoder.weights \"random\"): noise"
    )


class JobResult(Frozen):
    """What a successful job returns through the result backend: the manifest it wrote (the
    facts about the output) and how the run went (where, how long, at what cost)."""

    schema_version: Literal[2] = RESULT_SCHEMA_VERSION
    manifest: Manifest
    manifest_uri: str
    timings: StageTimings
    worker: WorkerInfo
    cost: CostReport | None = None
    reused: bool = Field(default=False, description="an earlier run's complete output was reused")
    finished_at: float = Field(description="unix time the job finished")

    @property
    def random_weights(self) -> bool:
        """Decoded with random weights (``decoder.weights: "random"``): the video is noise."""
        return self.manifest.random_weights
