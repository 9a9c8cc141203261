"""The result side of the wire format: what a worker sends back and leaves beside an output.

``Progress`` (the custom ``PROGRESS`` state), ``JobResult`` (with its ``Manifest``,
``StageTimings``, ``WorkerInfo`` and ``CostReport``) through the result backend,
``manifest.json`` beside the segments, and ``HeldRun`` records of runs that ended without a
result. Re-exported by ``producer.wire.spec``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from pydantic import Field

from producer.wire.base import SCHEMA_VERSION, Reported

#: JobResult's own version. 2: the ten fields a result shared with its manifest moved into
#: ``JobResult.manifest`` (read ``result.manifest.frames``, not ``result.frames``).
RESULT_SCHEMA_VERSION: Literal[2] = 2
#: Where a job's time goes, in pipeline order: ``StageTimings`` has one ``{stage}_s`` field per
#: name, the worker pipeline measures every one but ``load``, and metrics label by them.
STAGE_NAMES: tuple[str, ...] = (
    "load", "adapter_load", "text_encode", "denoise", "preview", "decode", "postprocess", "d2h",
    "encode", "upload",
)


#: The newest preview of a job, beside ``previews/step-NNNN.mp4`` (:func:`preview_name`).
PREVIEW_LATEST = "previews/latest.mp4"


def preview_name(step: int) -> str:
    """File name of the preview made after denoise step ``step``, in a job's output folder."""
    return f"previews/step-{step:04d}.mp4"


class PreviewInfo(Reported):
    """A preview of a generate job's video, made while it denoises: a small MP4 of the model's
    estimate of the clean video after ``step`` (``previews/step-NNNN.mp4``; the newest is also
    ``previews/latest.mp4``), without the VAE: noisy early, the video's layout and colours
    later."""

    step: int = Field(description="denoise steps done when it was made")
    steps_total: int
    uri: str = Field(description="previews/step-NNNN.mp4 under the job's output")
    latest_uri: str = Field(description="previews/latest.mp4: always the newest whole preview")
    width: int
    height: int
    frames: int = Field(description="one per latent frame")
    fps: float


class Progress(Reported):
    """Payload of the Celery custom state ``PROGRESS``: denoise steps first (generate jobs),
    then frames (``decode``), then the last segments' encode and upload once every frame is
    decoded (``upload``). ``worker`` is the node that runs it (``gpu0@host``)."""

    frames_done: int
    frames_total: int
    segments_done: int
    stage: Literal["denoise", "decode", "upload"] = "decode"
    steps_done: int = 0
    steps_total: int = 0
    worker: str | None = None
    preview: PreviewInfo | None = Field(default=None, description="the newest preview stored")
    warning: str | None = Field(
        default=None, description="what the worker wants the job's owner to know before "
        "waiting: a CPU worker's estimate of a job over a minute")

    @property
    def text(self) -> str:
        """``denoise 12/50`` while denoising, then ``120/121 frames``."""
        if self.stage == "denoise":
            return f"denoise {self.steps_done}/{self.steps_total}"
        return f"{self.frames_done}/{self.frames_total} frames"

    def describe(self) -> str:
        """The stage in words: ``denoise 37/40`` (``…, preview at s3://…/step-0035.mp4``),
        ``decode 13/49 frames, 1 segment``,
        ``upload: 49/49 frames decoded, 3 segments stored``."""
        segments = f"{self.segments_done} segment{'' if self.segments_done == 1 else 's'}"
        if self.stage == "denoise":
            return self.text + (f", preview at {self.preview.uri}" if self.preview else "")
        if self.stage == "upload":
            return f"upload: {self.text} decoded, {segments} stored"
        return f"decode {self.text}, {segments}"


class SegmentInfo(Reported):
    index: int
    uri: str
    first_frame: int
    frames: int
    bytes: int
    sha256: str
    seconds: float = Field(description="video duration of the segment")


class StageTimings(Reported):
    """Seconds spent per stage. Stages overlap in async mode, so they do not add up to wall."""

    load_s: float = 0.0
    adapter_load_s: float = Field(default=0.0, description="generate jobs: LoRAs loaded")
    text_encode_s: float = Field(default=0.0, description="generate jobs: prompt encoding")
    denoise_s: float = Field(default=0.0, description="generate jobs: the denoising loop")
    preview_s: float = Field(
        default=0.0, description="generate jobs: the previews' projection on the device (part "
        "of the denoise) and their encode (on a writer thread)")
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


class WorkerInfo(Reported):
    hostname: str
    node: str
    pid: int
    device: str
    gpu_name: str | None = None
    gpu_uuid: str | None = None


class Prices(Reported):
    """The prices a CostReport used, with where each came from."""

    instance_type: str
    region: str
    capacity: Literal["on-demand", "spot"]
    instance_usd_per_hour: float
    gpus_per_instance: int
    s3_put_usd_per_1000: float
    s3_storage_usd_per_gb_month: float
    sources: tuple[str, ...] = ()


class StageCost(Reported):
    """One stage's part of a job's cost: GPU-seconds held (none for s3), $ and share of total."""

    stage: str
    gpu_seconds: float
    usd: float
    share: float


class HeldRun(Reported):
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


class CostReport(Reported):
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
        default=(), description="text_encode, denoise, decode (GPU) and s3 (and adapter_load "
        "when a job loaded LoRAs): each with its share"
    )
    tier: str | None = Field(default=None, description="generate jobs: the tier denoised at")
    cache: str | None = Field(default=None, description="generate jobs: the step cache, or none")
    denoise_steps: int = Field(default=0, ge=0, description="generate jobs: denoise steps")
    gpu_seconds_per_denoise_step: float | None = Field(
        default=None, description="generate jobs: the denoise stage's GPU-seconds per step")

    def summary(self) -> str:
        """One line: ``$0.004812 total: GPU $0.004667 (5.00 s), S3 $0.000145; $0.0301 per
        video-minute (g7e.2xlarge on-demand $3.3600/h)``. ``str()`` gives the same; the whole
        report (prices, their sources, stages) is ``model_dump()``."""
        p = self.prices
        s3 = self.s3_put_usd + self.storage_usd_per_month
        return (f"${self.total_usd:.6f} total: GPU ${self.gpu_usd:.6f} ({self.gpu_seconds:.2f} "
                f"s), S3 ${s3:.6f}; ${self.usd_per_video_minute:.4f} per video-minute "
                f"({p.instance_type} {p.capacity} ${p.instance_usd_per_hour:.4f}/h)")

    def __str__(self) -> str:
        return self.summary()


class ImageFacts(Reported):
    """An image a job conditioned on: which file (its sha256) and how it was sized."""

    sha256: str
    format: str
    source_size: tuple[int, int] = Field(description="(width, height) as stored")
    size: tuple[int, int] = Field(description="(width, height) given to the model")
    resize: str = Field(description="generate.image_resize")


class LoraFacts(Reported):
    """A LoRA a job ran with: which file (its sha256), at what scale, on which expert."""

    uri: str
    sha256: str
    scale: float
    name: str | None = None
    expert: str = "both"


class GenerateFacts(Reported):
    """What a generate job ran with: its speed settings, so an output says how it was made."""

    tier: str = Field(description="exact or fp8 (GenerateSpec.tier)")
    cache: str = Field(default="none", description="the step cache's kind, or none")
    cache_params: dict[str, Any] | None = Field(
        default=None, description="the step cache's parameters as the job gave them")
    steps: int = Field(description="denoise steps run")
    compiled: bool = Field(default=False, description="the transformer ran compiled (CUDA)")
    image: ImageFacts | None = None
    last_image: ImageFacts | None = None
    loras: tuple[LoraFacts, ...] = ()
    random_weights: bool = Field(
        default=False, description="the model folder is labelled random weights (written by "
        "framefleet models tiny): the video is noise")
    preview_every: int = Field(default=0, description="a preview every N denoise steps; 0: off")
    previews: int = Field(default=0, description="previews stored")


class Manifest(Reported):
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
        default=False, description="made with random weights (decoder.weights \"random\", or "
        "a generate model folder labelled random, as framefleet models tiny writes): noise"
    )
    generate: GenerateFacts | None = Field(
        default=None, description="generate jobs: the tier, the step cache and the inputs")


class JobResult(Reported):
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
        """Made with random weights (``decoder.weights: "random"``, or a model folder labelled
        random): the video is noise."""
        return self.manifest.random_weights


class StateTime(Reported):
    """One state of a job's run in the ledger, and when it began (unix time)."""

    state: Literal["QUEUED", "STARTED", "SUCCESS", "FAILURE", "REVOKED"]
    at: float


#: The ledger record's own version.
LEDGER_SCHEMA_VERSION: Literal[1] = 1


class LedgerRecord(Reported):
    """One ended job in the durable ledger (``FRAMEFLEET_LEDGER_URI``): written once by the
    worker that ended it (success, failure or cancel), one JSON object per file.

    ``result`` is the ``JobResult`` of a success: its manifest names the output's URIs, its
    ``timings`` the seconds per stage, its ``cost`` the direct cost. ``held`` are the runs that
    ended without a result: the earlier runs that sent the job back (retries, requeues) and,
    for a failure or a cancel, the last one; each with its GPU time and prices. A job
    submitted again after it ended gets a record of its own for each end.
    """

    schema_version: Literal[1] = LEDGER_SCHEMA_VERSION
    key: str = Field(description="tenant:job_id (plain job_id for the default tenant)")
    job_id: str
    tenant: str
    spec_digest: str
    status: Literal["success", "failure", "cancelled"]
    reason: str = Field(default="", description="the error's class, for a failure")
    error: str | None = Field(default=None, description="the error's message, for a failure")
    node: str = Field(description="the worker that ended it")
    states: tuple[StateTime, ...] = Field(description="QUEUED, STARTED, then the end")
    error_retries: int = 0
    requeues: int = 0
    output_uri: str = Field(description="the job's folder: {output.uri}/{tenant}/{job_id}")
    result: JobResult | None = None
    held: tuple[HeldRun, ...] = ()
    finished_at: float

    @property
    def gpu_seconds(self) -> float:
        """GPU time of every run of this job: the result's and the runs without one."""
        done = 0.0 if self.result is None else (
            self.result.cost.gpu_seconds if self.result.cost is not None
            else self.result.timings.wall_s)
        return done + sum(h.gpu_seconds for h in self.held)
