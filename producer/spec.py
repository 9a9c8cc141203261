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

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from producer.errors import InvalidJobError

#: Identifiers that become object-key components: no slash, no "." / ".." (path traversal).
ID_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
SCHEMA_VERSION: Literal[1] = 1
#: JobResult's own version. 2: the ten fields a result shared with its manifest moved into
#: ``JobResult.manifest`` (read ``result.manifest.frames``, not ``result.frames``).
RESULT_SCHEMA_VERSION: Literal[2] = 2
#: Where a job's time goes, in pipeline order: ``StageTimings`` has one ``{stage}_s`` field per
#: name, the worker pipeline measures every one but ``load``, and metrics label by them.
STAGE_NAMES: tuple[str, ...] = ("load", "decode", "postprocess", "d2h", "encode", "upload")
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

    name: Literal["wan2.1-vae", "pattern"] = "wan2.1-vae"
    weights: str | None = Field(
        default=None,
        description="diffusers-layout folder (file://) of the decoder's model, or \"random\": "
        "a seeded random init that decodes to noise (tests, demos); the Wan decoders need one "
        "of the two, the pattern decoder neither",
    )
    preset: Literal["wan2.1", "tiny"] = Field(
        default="wan2.1", description="architecture config; 'tiny' is for tests and demos"
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="auto: bfloat16 on CUDA, float32 on CPU"
    )
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="seed of the random init")

    @field_validator("weights")
    @classmethod
    def _weights(cls, v: str | None) -> str | None:
        return v if v is None or v == RANDOM_WEIGHTS else check_uri(v, field="decoder.weights")


class VideoSpec(Frozen):
    """How frames become MP4 segments."""

    fps: float = Field(default=16.0, gt=0, le=240)
    codec: Literal["libx264", "h264_nvenc"] = "libx264"
    crf: int = Field(default=20, ge=0, le=51)
    preset: Literal[
        "ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower"
    ] = "veryfast"
    segment_frames: int = Field(default=48, ge=1, le=100_000)
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


class PipelineSpec(Frozen):
    mode: Literal["async", "sequential"] = "async"
    ring_slots: int = Field(default=3, ge=2, le=16)
    encoder_threads: int | None = Field(
        default=None, ge=1, le=16, description="segment encoders in flight; None: from CPU count"
    )


class JobSpec(Frozen):
    """One video job, as the producer submits it."""

    schema_version: Literal[1] = SCHEMA_VERSION
    job_id: str
    tenant: str = "default"
    input: InputSpec
    decoder: DecoderSpec = DecoderSpec()
    video: VideoSpec = VideoSpec()
    output: OutputSpec
    pipeline: PipelineSpec = PipelineSpec()
    priority: int = Field(default=5, ge=0, le=9, description="9 is the most urgent")
    time_limit_s: int = Field(default=3600, ge=1, le=86_400)

    @field_validator("job_id")
    @classmethod
    def _job_id(cls, v: str) -> str:
        return check_id(v, "job_id")

    @field_validator("tenant")
    @classmethod
    def _tenant(cls, v: str) -> str:
        return check_id(v, "tenant")

    def digest(self) -> str:
        """sha256 of the canonical JSON: two submissions of one job_id must carry the same."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def output_prefix(self) -> str:
        return f"{self.output.uri}/{self.tenant}/{self.job_id}"


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
    """Payload of the Celery custom state ``PROGRESS``."""

    frames_done: int
    frames_total: int
    segments_done: int


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
    random_weights: bool = Field(
        default=False, description="decoded with random weights (decoder.weights \"random\"): noise"
    )
    finished_at: float = Field(description="unix time the job finished")
