"""The one place that reads ``FRAMEFLEET_*`` environment variables.

Every field is documented and range-checked; ``get_settings()`` reads the environment once per
process (call ``get_settings.cache_clear()`` in tests that change it).
"""

from __future__ import annotations

import os
from functools import lru_cache
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, IPvAnyAddress, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from producer.errors import InvalidJobError, SettingsError
from producer.ports import DEFAULT_API_PORT, DEFAULT_EXPORTER_PORT, DEFAULT_METRICS_PORT

ENV_PREFIX = "FRAMEFLEET_"


def env_error_text(e: ValidationError) -> str:
    """pydantic's errors, each naming the environment variable (``FRAMEFLEET_RETRY_MAX``)
    and the value it had, not the field."""
    lines = []
    for err in e.errors():
        if err["loc"]:
            name = ENV_PREFIX + str(err["loc"][0]).upper()
            lines.append(f"{name}={err['input']!r}: {err['msg']}")
        else:
            lines.append(str(err["msg"]).removeprefix("Value error, "))
    return "invalid settings: " + "; ".join(lines)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="ignore")

    def __init__(self, **values: Any) -> None:
        """Read the environment (``values`` win); a bad value raises ``SettingsError``."""
        try:
            super().__init__(**values)
        except ValidationError as e:
            raise SettingsError(env_error_text(e)) from None

    broker_url: str = Field(
        default="redis://127.0.0.1:6379/0",
        description="Celery broker: redis://[:password@]host:port/db, rediss:// for TLS",
    )
    result_backend: str | None = Field(
        default=None, description="Celery result backend; default: the broker URL"
    )
    max_time_limit_s: int = Field(
        default=6 * 3600, ge=60, le=7 * 86_400, description="largest time_limit_s a job may ask"
    )
    visibility_timeout_s: int | None = Field(
        default=None,
        ge=60,
        description="Redis visibility timeout; must exceed max_time_limit_s (default: +15 min)",
    )
    result_expires_s: int = Field(default=7 * 86_400, ge=60, description="results kept this long")
    s3_endpoint_url: str | None = Field(
        default=None, description="S3-compatible endpoint (SeaweedFS, MinIO); unset on AWS"
    )
    s3_region: str = Field(default="us-east-1", description="S3 region for SigV4")
    s3_max_attempts: int = Field(default=5, ge=1, le=20, description="botocore retry attempts")
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
    decode_graphs: int = Field(
        default=2, ge=0, le=16,
        description="CUDA: compiled, graph-captured decode sizes kept per decoder; 0: eager",
    )
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
    metrics_port: int = Field(
        default=DEFAULT_METRICS_PORT, ge=0, le=65_535,
        description="worker /metrics port: + GPU index, CPU workers + 100 + slot; 0: off",
    )
    exporter_port: int = Field(
        default=DEFAULT_EXPORTER_PORT, ge=1, le=65_535, description="fleet exporter port"
    )
    metrics_tenants: str = Field(
        default="", pattern=r"^(\*|[A-Za-z0-9._-]{1,128}(,[A-Za-z0-9._-]{1,128}){0,99})?$",
        description="tenants that keep their name in the metrics' tenant label (comma-separated,"
        " at most 100; others: 'other'); '*': every tenant (unbounded)",
    )
    metrics_addr: IPvAnyAddress = Field(
        default=IPv4Address("127.0.0.1"),
        description="address /metrics and the exporter listen on; the images set 0.0.0.0",
    )
    instance_type: str = Field(default="g7e.2xlarge", description="EC2 type, for cost reports")
    capacity: Literal["on-demand", "spot"] = Field(default="on-demand", description="pricing")
    pricing_file: str | None = Field(
        default=None, description="JSON/TOML file overriding catalog prices"
    )
    imds_url: str = Field(
        default="http://169.254.169.254", description="EC2 instance metadata (spot notices)"
    )
    spot_watch: bool = Field(
        default=False, description="poll IMDSv2 for spot interruption notices (set on EC2 spot)"
    )
    spot_poll_s: float = Field(default=5.0, gt=0, le=60, description="spot notice poll period")
    cancel_poll_s: float = Field(
        default=0.25, ge=0, le=10, description="least time between two cancel-flag reads"
    )
    retry_max: int = Field(default=5, ge=0, le=20, description="retries of a retryable error")
    retry_backoff_s: float = Field(default=2.0, gt=0, le=600, description="first retry delay")
    retry_backoff_max_s: float = Field(default=120.0, gt=0, le=3600, description="retry cap")
    file_roots: str | None = Field(
        default=None,
        description="absolute folders (':'-separated) a job's file:// paths may lie under; "
        "unset: the embedded mode's folder, none on a real broker; empty: none",
    )
    recovery_period_s: float = Field(
        default=10.0, ge=0, le=300,
        description="host-loss sweep: seconds between two sweeps of unacked jobs; 0: off",
    )
    recovery_grace_s: float = Field(
        default=45.0, ge=1, le=3600,
        description="host-loss sweep: an unacked job nobody touched this long, its lease "
        "expired, is requeued",
    )
    webhook_secret: SecretStr | None = Field(
        default=None, description="HMAC-SHA256 key signing every webhook; unset: none are sent"
    )
    webhook_schemes: str = Field(
        default="https", pattern=r"^\s*(https?)(\s*,\s*https?)*\s*$",
        description="comma-separated URL schemes webhooks may use (https, http)",
    )
    webhook_hosts: str = Field(
        default="", max_length=4096,
        description="comma-separated webhook allow-list: host names, *.suffix wildcards, IPs or "
        "networks (CIDR); empty: any host. Non-public addresses only inside listed networks",
    )
    webhook_timeout_s: float = Field(
        default=5.0, gt=0, le=60, description="connect and read timeout of one delivery"
    )
    webhook_max_attempts: int = Field(
        default=6, ge=1, le=20, description="deliveries of one event before it is dropped"
    )
    webhook_backoff_s: float = Field(
        default=1.0, gt=0, le=600, description="first webhook retry delay (then doubled)"
    )
    webhook_backoff_max_s: float = Field(
        default=60.0, gt=0, le=3600, description="webhook retry delay cap"
    )
    webhook_max_age_s: float = Field(
        default=900.0, gt=0, le=86_400, description="an event not delivered by then is dropped"
    )
    webhook_queue: int = Field(
        default=1000, ge=1, le=100_000, description="webhook events waiting per worker process"
    )
    max_worker_losses: int = Field(
        default=3, ge=1, le=100,
        description="times a job's worker may die under it (crash, OOM killer, lost host) "
        "before the job ends in FAILURE instead of being delivered again",
    )
    max_requeues: int | None = Field(
        default=None, ge=1, le=10_000_000,
        description="requeues (lease waits, preemptions, the OOM fallback) before a job fails; "
        "they never spend the retry budget. Default: enough 5 s lease waits to outlast "
        "max_time_limit_s, plus 100",
    )
    output_prefix: str | None = Field(
        default=None, pattern=r"^(s3://[^/\s]+|file:///)\S*$",
        description="s3:// or file:// prefix every job's output.uri must be under; unset: any",
    )

    ledger_uri: str | None = Field(
        default=None, pattern=r"^(s3://[^/\s]+|file:///)\S*$",
        description="s3:// or file:// prefix of the durable job and cost ledger; unset: none")
    wait_outage_s: float = Field(default=120.0, ge=0, le=86_400, description="how long `wait` "
                                 "rides out a broker or backend that stops answering")
    idle_hint_s: float = Field(default=30.0, ge=1, le=86_400, description="a job queued this "
                               "long, no job taken for as long: `status` and `wait` hint why")
    flower_basic_auth: SecretStr | None = Field(default=None, description="`framefleet "
                                                "flower`'s login: user:password[,user:password]")

    # --- `framefleet api`: the HTTP gateway (producer/api) ----------------------------------
    api_addr: IPvAnyAddress = Field(
        default=IPv4Address("127.0.0.1"),
        description="address `framefleet api` listens on; loopback unless set (the images "
        "set 0.0.0.0 behind their network policy)",
    )
    api_port: int = Field(default=DEFAULT_API_PORT, ge=1, le=65_535, description="API port")
    api_keys_file: str | None = Field(
        default=None,
        description="TOML or JSON file of the gateway's API keys, each stored as its sha256 "
        "with the tenant it belongs to (a mounted Secret in production); required by the API",
    )
    api_models_file: str | None = Field(
        default=None,
        description="TOML or JSON file mapping model names to server-side model folders, "
        "defaults and limits; the only models the API serves",
    )
    api_max_body_bytes: int = Field(
        default=64 * 1024, ge=1024, le=16 * 1024**2,
        description="largest request body the API reads (413 beyond), uploads excepted",
    )
    api_max_upload_bytes: int = Field(
        default=10 * 1024**2, ge=1024, le=512 * 1024**2,
        description="largest multipart request carrying an input_reference image (413 beyond)",
    )
    api_rate_per_minute: int = Field(
        default=600, ge=1, le=1_000_000,
        description="requests one tenant may make per minute, across every replica (429 "
        "beyond); a key in the keys file may set its own",
    )
    api_max_in_flight: int = Field(
        default=16, ge=1, le=100_000,
        description="unfinished jobs one tenant may have (429 on the next submit); a key in "
        "the keys file may set its own",
    )
    api_content: Literal["proxy", "redirect"] = Field(
        default="proxy",
        description="how /content and job files are served: proxy (the gateway streams them, "
        "with Range) or redirect (307 to a presigned S3 URL, which the client must reach)",
    )
    api_presign_s: int = Field(
        default=300, ge=10, le=7 * 86_400, description="lifetime of a presigned content URL"
    )
    api_input_prefix: str | None = Field(
        default=None, pattern=r"^s3://[^/\s]+(/\S*)?$",
        description="s3:// prefix for uploads (input_reference) and native jobs' inputs: "
        "each tenant reads and writes only under PREFIX/TENANT/; unset: neither is accepted",
    )
    api_hls_js: str | None = Field(
        default=None,
        description="hls.min.js the page serves (the pinned npm file: .node/node_modules/"
        "hls.js/dist/hls.min.js); unset: the page lists jobs but cannot play them",
    )
    api_events_poll_s: float = Field(
        default=0.5, ge=0.05, le=10, description="how often a job's event stream reads its state"
    )

    def check_output_uri(self, uri: str) -> None:
        """Refuse (``InvalidJobError`` naming ``output.uri``) an output outside
        ``output_prefix``; the client checks at submit, the worker again on receipt."""
        prefix = self.output_prefix
        if prefix is None:
            return
        base, target = prefix.rstrip("/"), uri.rstrip("/")
        if target != base and not target.startswith(base + "/"):
            raise InvalidJobError(f"output.uri: {uri} is not under this fleet's output prefix "
                                  f"{prefix} (FRAMEFLEET_OUTPUT_PREFIX)")

    @model_validator(mode="after")
    def _visibility(self) -> Settings:
        if self.visibility_timeout_s is not None and (
            self.visibility_timeout_s <= self.max_time_limit_s
        ):
            raise ValueError(
                "FRAMEFLEET_VISIBILITY_TIMEOUT_S must exceed FRAMEFLEET_MAX_TIME_LIMIT_S, "
                "or a running job is delivered to a second worker"
            )
        return self

    @model_validator(mode="after")
    def _local(self) -> Settings:
        for root in self.file_root_list:
            if not os.path.isabs(root) or ".." in Path(root).parts:
                raise ValueError(
                    f"FRAMEFLEET_FILE_ROOTS: {root!r} is not an absolute path without '..'"
                )
        if self.recovery_period_s and self.recovery_grace_s < 3 * self.recovery_period_s:
            raise ValueError(
                "FRAMEFLEET_RECOVERY_GRACE_S must be at least 3 x FRAMEFLEET_RECOVERY_PERIOD_S, "
                "or a live worker that misses one touch loses its jobs to another"
            )
        return self

    @model_validator(mode="after")
    def _flower_auth(self) -> Settings:
        auth = self.flower_basic_auth  # not a field pattern: its error would print the password
        pairs = [p.partition(":") for p in (auth.get_secret_value() if auth else "").split(",")]
        if auth and any(not user or not pw or " " in user + pw for user, _, pw in pairs):
            raise ValueError("FRAMEFLEET_FLOWER_BASIC_AUTH: not user:password (value not shown)")
        return self

    @property
    def file_root_list(self) -> tuple[str, ...]:
        """FRAMEFLEET_FILE_ROOTS split on ':' (empty when unset or empty)."""
        return tuple(r for r in (self.file_roots or "").split(":") if r)

    @property
    def backend_url(self) -> str:
        return self.result_backend or self.broker_url

    @property
    def visibility_timeout(self) -> int:
        return self.visibility_timeout_s or self.max_time_limit_s + 15 * 60

    @property
    def requeue_limit(self) -> int:
        # 5 s: worker.lifecycle.lease.LEASE_RETRY_S, the wait between two looks at a held lease.
        return self.max_requeues or self.max_time_limit_s // 5 + 100

    @property
    def metrics_tenant_names(self) -> frozenset[str] | None:
        """The tenants of ``metrics_tenants``; None means every tenant (``*``)."""
        if self.metrics_tenants == "*":
            return None
        return frozenset(name for name in self.metrics_tenants.split(",") if name)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
