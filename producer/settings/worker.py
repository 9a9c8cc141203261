"""The worker's device, input limits, memory guard, scratch folders and decoder warm-up."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class WorkerSettings(BaseModel):
    """What a worker process decodes on, refuses and warms up."""

    device: Literal["auto", "cuda", "cpu"] = Field(
        default="auto", description="where decoding runs; auto: CUDA when available"
    )
    max_frames: int = Field(default=4_000, ge=1, description="reject jobs with more frames")
    max_pixels: int = Field(
        default=1920 * 1088, ge=64, description="reject frames larger than this (width x height)"
    )
    max_input_bytes: int = Field(
        default=2 * 1024**3, ge=1024, description="reject latents files larger than this"
    )
    max_message_bytes: int = Field(
        default=64 * 1024, ge=1024, description="reject job messages larger than this"
    )
    max_rss_mib: int | None = Field(
        default=None, ge=0, le=64 * 1024**2,
        description="memory guard: a worker process whose resident memory (RSS) grows past this "
        "many MiB fails its job (checked before a model loads, between denoise steps and "
        "between decoded chunks) instead of leaving the host's OOM killer to pick a victim; "
        "unset: 90% of the host's memory (or of its cgroup's limit, if lower); 0: off",
    )
    work_dir: str | None = Field(
        default=None, description="scratch folder for segments before upload (default: tmp)"
    )
    data_dir: str = Field(
        default=".framefleet", description="embedded mode: broker folders and sqlite results"
    )
    warmup_decoder: Literal["wan2.1-vae", "wan2.2-vae", "pattern"] | None = Field(
        default=None, description="decoder built and warmed up when a worker starts"
    )
    warmup_latent_size: str = Field(
        default="60x104", pattern=r"^[0-9]{1,4}x[0-9]{1,4}(,[0-9]{1,4}x[0-9]{1,4}){0,7}$",
        description="latent HxW of the warm-up, up to 8 comma-separated (60x104 = 480x832 "
        "frames with wan2.1-vae; 44x80 = 704x1280 with wan2.2-vae); the worker reports ready "
        "once every size is compiled and captured",
    )
    warmup_weights: str | None = Field(
        default=None,
        description="the warm-up decoder's weights folder (file://, diffusers layout): give the "
        "jobs' decoder.weights so they use the warmed decoder; unset: a seeded random init",
    )
    compile_cache_dir: str | None = Field(
        default=None,
        description="CUDA: folder kept across worker restarts for torch.compile's caches "
        "(inductor FX graphs, Triton kernels, autotuning): a restarted worker replays its "
        "warm-up sizes in seconds instead of compiling again; None: the process's temp folder",
    )
    pool_start_timeout_s: float | None = Field(
        default=None, gt=0, le=6 * 3600,
        description="seconds a pool process may take to start (imports, then the warm-up "
        "model and decoder) before Celery kills it as hung and starts another; unset: 120 "
        "without a warm-up, 1800 with FRAMEFLEET_WARMUP_MODEL or FRAMEFLEET_WARMUP_DECODER "
        "(a cold load of a published folder plus a cold compile)",
    )
    pool_start_failures: int = Field(
        default=3, ge=1, le=100,
        description="pool processes in a row that end before they are up (killed, crashed, "
        "timed out) after which the worker stops with exit status 75 so that its "
        "supervisor restarts it, instead of Celery replacing the child for ever",
    )
    build_idle_s: float = Field(
        default=2.0, ge=0, le=3600,
        description="seconds a worker process must have had no job before a background "
        "build (a new decode size's graph) starts: a job that arrives during a build waits "
        "for it, so builds wait for a gap in the queue; 0: right after each job",
    )
    stuck_s: float = Field(
        default=900.0, ge=0, le=86_400,
        description="stuck-job watchdog: a job whose progress (a denoise step, a decoded "
        "chunk, a stored segment) stops for this many seconds is taken for hung: its pool "
        "process logs every thread's stack, is retired, and the job, delivered once more, "
        "fails naming the stage it stopped in; 0: off. The default is above the longest "
        "healthy silence of a 14B job: before its first report a job may load a model "
        "folder from a cold disk and compile its transformer at a new size (minutes each), "
        "and one 14B denoise step at 720p takes tens of seconds",
    )
    decode_graphs: int = Field(
        default=2, ge=0, le=16,
        description="CUDA: compiled, graph-captured decode sizes kept per decoder; 0: eager",
    )
