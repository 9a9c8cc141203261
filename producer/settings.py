"""The one place that reads ``FRAMEFLEET_*`` environment variables.

Every field is documented and range-checked; ``get_settings()`` reads the environment once per
process (call ``get_settings.cache_clear()`` in tests that change it).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from producer.errors import SettingsError

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
    warmup_decoder: Literal["wan2.1-vae", "pattern"] | None = Field(
        default=None, description="decoder built and warmed up when a worker starts"
    )
    warmup_latent_size: str = Field(
        default="60x104", pattern=r"^[0-9]{1,4}x[0-9]{1,4}$",
        description="latent HxW of the warm-up (60x104 = 480x832 frames)",
    )
    decode_graphs: int = Field(
        default=2, ge=0, le=16,
        description="CUDA: compiled, graph-captured decode sizes kept per decoder; 0: eager",
    )
    metrics_port: int = Field(
        default=9400, ge=0, le=65_535, description="worker /metrics port (+ GPU index); 0: off"
    )
    exporter_port: int = Field(default=9410, ge=1, le=65_535, description="fleet exporter port")
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

    @property
    def backend_url(self) -> str:
        return self.result_backend or self.broker_url

    @property
    def visibility_timeout(self) -> int:
        return self.visibility_timeout_s or self.max_time_limit_s + 15 * 60


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
