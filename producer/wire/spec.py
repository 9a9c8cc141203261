"""THE wire format: every message between producer and worker is one of these frozen models.

JSON only (pickle is never accepted). Validation rejects bad values with a message naming the
field; ``parse_spec`` turns pydantic's errors into one :class:`InvalidJobError` line per field.

This module holds the request side (``JobSpec`` and its parts); what comes back (``Progress``,
``JobResult``, ``Manifest``, ``CostReport``, ``HeldRun``) lives in ``producer.wire.results`` and is
re-exported here, so ``producer.wire.spec`` names every model of the wire.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Literal
from urllib.parse import urlparse

from pydantic import (
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from producer.errors import InvalidJobError
from producer.wire.base import SCHEMA_VERSION, Frozen, check_uri
from producer.wire.generation import (  # the generate request, re-exported
    CacheSpec,
    FirstBlockCache,
    GenerateSpec,
    LoraSpec,
    MagCache,
    PreviewSpec,
    TaylorSeerCache,
    unset_generate_fields,
)
from producer.wire.results import (  # the result side, re-exported: every model of the wire
    PREVIEW_LATEST,
    RESULT_SCHEMA_VERSION,
    STAGE_NAMES,
    CostReport,
    GenerateFacts,
    HeldRun,
    ImageFacts,
    JobResult,
    LoraFacts,
    Manifest,
    PreviewInfo,
    Prices,
    Progress,
    SegmentInfo,
    StageCost,
    StageTimings,
    WorkerInfo,
    check_stage_fields,
    preview_name,
)

__all__ = [
    "DECODER_FPS",
    "DECODER_PRESETS",
    "DEFAULT_TENANT",
    "ID_RE",
    "KEY_SEP",
    "PREVIEW_LATEST",
    "RANDOM_WEIGHTS",
    "RESULT_SCHEMA_VERSION",
    "SCHEMA_VERSION",
    "STAGE_NAMES",
    "CacheSpec",
    "CostReport",
    "DecoderSpec",
    "FirstBlockCache",
    "Frozen",
    "GenerateFacts",
    "GenerateSpec",
    "HeldRun",
    "ImageFacts",
    "InputSpec",
    "JobResult",
    "JobSpec",
    "LoraFacts",
    "LoraSpec",
    "MagCache",
    "Manifest",
    "NotifySpec",
    "OutputSpec",
    "PipelineSpec",
    "PreviewInfo",
    "PreviewSpec",
    "Prices",
    "Progress",
    "SegmentInfo",
    "StageCost",
    "StageTimings",
    "TaylorSeerCache",
    "VideoSpec",
    "WorkerInfo",
    "check_id",
    "check_stage_fields",
    "check_uri",
    "job_key",
    "parse_spec",
    "preview_name",
    "segment_name",
    "split_key",
]

#: Identifiers that become object-key components: no slash, no "." / ".." (path traversal).
ID_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
#: ``DecoderSpec.weights`` that asks for a seeded random init: the output is noise, and the
#: manifest and the result say so (``random_weights``).
RANDOM_WEIGHTS = "random"


def check_id(value: str, field: str) -> str:
    if not ID_RE.fullmatch(value) or value in {".", ".."}:
        raise ValueError(f"{field} must match [A-Za-z0-9._-]{{1,128}} and not be '.' or '..'")
    return value


#: The tenant of a spec that names none.
DEFAULT_TENANT = "default"
#: Between a tenant and a job_id in a job's key; never inside an id (``ID_RE``).
KEY_SEP = ":"


def job_key(tenant: str, job_id: str) -> str:
    """A job's identity across the fleet: ``tenant:job_id``, and plain ``job_id`` for the
    default tenant. It is the Celery task id and names every Redis record of the job, so two
    tenants' jobs of one job_id never meet: ``:`` is in no id, and so no other tenant's key can
    equal a default-tenant key (which keeps the form jobs had before tenants were scoped)."""
    return job_id if tenant == DEFAULT_TENANT else f"{tenant}{KEY_SEP}{job_id}"


def split_key(key: str, tenant: str | None = None) -> tuple[str, str]:
    """(tenant, job_id) of a job key (``tenant:job_id`` or ``job_id``), both checked.

    A bare job_id belongs to ``tenant`` (default: the default tenant). Raises ``ValueError``
    naming what is wrong."""
    if KEY_SEP in key:
        owner, _, job_id = key.partition(KEY_SEP)
        if tenant is not None and tenant != owner:
            raise ValueError(f"job {key!r} belongs to tenant {owner!r}, not {tenant!r}")
    else:
        owner, job_id = tenant or DEFAULT_TENANT, key
    return check_id(owner, "tenant"), check_id(job_id, "job_id")


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
    seed: StrictInt = Field(default=0, ge=0, le=2**31 - 1, description="seed of the random init")

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

    fps: StrictFloat = Field(default=16.0, gt=0, le=240)
    codec: Literal["libx264", "h264_nvenc"] = "libx264"
    crf: StrictInt = Field(default=20, ge=0, le=51)
    preset: Literal[
        "ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower"
    ] = "veryfast"
    segment_frames: StrictInt = Field(default=48, ge=1, le=100_000)
    first_segment_frames: StrictInt | None = Field(
        default=None, ge=1, le=100_000,
        description="frames of the first segment only (fewer: the live stream starts sooner); "
        "None: segment_frames",
    )
    tune: Literal["zerolatency", "none", "film", "animation"] = Field(
        default="zerolatency",
        description="x264 tune; zerolatency keeps no frames buffered, so a job's encode tail "
        "after its last decoded chunk (GPU time paid for nothing) is a few ms",
    )
    stitch: StrictBool = Field(default=False, description="also write full.mp4 (all segments)")


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
    ring_slots: StrictInt = Field(default=3, ge=2, le=16)
    encoder_threads: StrictInt | None = Field(
        default=None, ge=1, le=16, description="segment encoders in flight; None: from CPU count"
    )


#: What a job can notify: it started, a preview was stored (while denoising), a segment joined
#: the live playlist, it ended.
NotifyEvent = Literal["started", "preview", "segment", "succeeded", "failed", "cancelled"]


class NotifySpec(Frozen):
    """Webhooks of one job: POSTs of signed JSON to ``urls`` for each of ``events``.

    Only the URL's form is checked here; the fleet's allow-list (producer/webhooks/rules.py) is
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
    tenant: str = DEFAULT_TENANT
    input: InputSpec | None = None
    generate: GenerateSpec | None = None
    decoder: DecoderSpec = DecoderSpec()
    video: VideoSpec = Field(default_factory=VideoSpec, validate_default=True)
    output: OutputSpec
    pipeline: PipelineSpec = PipelineSpec()
    priority: StrictInt = Field(default=5, ge=0, le=9, description="9 is the most urgent")
    time_limit_s: StrictInt = Field(default=3600, ge=1, le=86_400)
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

    @property
    def key(self) -> str:
        """The job's identity across the fleet (``job_key``): its Celery task id and the name
        of its registry records."""
        return job_key(self.tenant, self.job_id)


def _unset_additions(spec: JobSpec) -> dict[str, Any]:
    """Fields added to schema 1 later, left out of the digest while unset: a spec that does
    not use them keeps the digest it always had (reruns still match their manifests)."""
    exclude: dict[str, Any] = {}
    if spec.notify is None:
        exclude["notify"] = True
    if spec.generate is None:
        exclude["generate"] = True
    elif unset_generate_fields(spec.generate):
        exclude["generate"] = unset_generate_fields(spec.generate)
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
            # list positions as [i]: generate.loras[0].uri, notify.urls[1]
            loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"])
            loc = loc.lstrip(".") or "spec"
            msg = str(err["msg"]).removeprefix("Value error, ")
            # our validators name the field already ("output.uri: ..."): not twice; a model's
            # validator may name one of its own fields ("generate.preview.every: ...")
            named = re.match(rf"{re.escape(loc)}(?:[.\[][\w.\[\]]*)?: ", msg)
            lines.append(msg if named else f"{loc}: {msg}")
        raise InvalidJobError("invalid job spec: " + "; ".join(lines)) from None
