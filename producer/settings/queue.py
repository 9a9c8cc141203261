"""The broker, the result backend, S3, time limits, retries and the requeue caps."""

from __future__ import annotations

from pydantic import BaseModel, Field, SecretStr, model_validator

from producer.settings.urls import check_urls


class QueueSettings(BaseModel):
    """Where jobs travel and are stored, and how long and how often they may run."""

    broker_url: str = Field(
        default="redis://127.0.0.1:6379/0",
        description="Celery broker: redis://[:password@]host:port/db, rediss:// for TLS, "
        "sentinel://[:password@]host:26379/db;sentinel://host2:26379/db behind Redis Sentinel "
        "(with sentinel_master), filesystem:// for the embedded mode",
    )
    result_backend: str | None = Field(
        default=None, description="Celery result backend (redis://, rediss://, sentinel://); "
        "default: the broker URL"
    )
    sentinel_master: str | None = Field(
        default=None, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._-]+$",
        description="the name the Sentinels monitor the Redis primary under (sentinel monitor "
        "NAME ...); required when a URL is sentinel://",
    )
    sentinel_password: SecretStr | None = Field(
        default=None,
        description="password of the Sentinels themselves (their requirepass), when they have "
        "one; the Redis primary's password goes in the URL",
    )
    max_time_limit_s: int = Field(
        default=6 * 3600, ge=60, le=7 * 86_400, description="largest time_limit_s a job may ask"
    )
    hard_limit_after_s: int = Field(
        default=60, ge=1, le=600,  # below the default visibility margin (15 min)
        description="seconds from a job's soft time limit (its time_limit_s: the run is asked to "
        "stop) to the hard one, when the worker's main process kills the pool process that "
        "still runs it (a hang in native code); decided where the worker runs",
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
    retry_max: int = Field(default=5, ge=0, le=20, description="retries of a retryable error")
    retry_backoff_s: float = Field(default=2.0, gt=0, le=600, description="first retry delay")
    retry_backoff_max_s: float = Field(default=120.0, gt=0, le=3600, description="retry cap")
    recovery_period_s: float = Field(
        default=2.0, ge=0, le=300,
        description="host-loss sweep: seconds between two rounds, in which each worker touches "
        "the jobs it holds and looks for orphans; 0: off",
    )
    recovery_grace_s: float = Field(
        default=10.0, ge=1, le=3600,
        description="host-loss sweep: an unacked job nobody touched this long, its lease "
        "expired, is requeued (default: one job lease, so a lost host's job runs again within "
        "about grace + period)",
    )
    reconcile_after_s: float = Field(
        default=30.0, ge=0, le=86_400,
        description="lost-message reconciler: a job sent this many seconds ago, not yet "
        "received by a worker, whose message is in no queue list and not unacked (lost in a "
        "Redis failover), is sent again; 0: off. Runs in the host-loss sweep's rounds and "
        "judges a message lost in two of them: a lost job is sent again about this + 2 x "
        "FRAMEFLEET_RECOVERY_PERIOD_S after it was sent",
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

    @model_validator(mode="after")
    def _urls(self) -> QueueSettings:
        check_urls(self.broker_url, self.result_backend, self.sentinel_master)
        return self

    @property
    def backend_url(self) -> str:
        return self.result_backend or self.broker_url

    @property
    def visibility_timeout(self) -> int:
        return self.visibility_timeout_s or self.max_time_limit_s + 15 * 60

    @property
    def requeue_limit(self) -> int:
        # 5 s: worker.concerns.lease.LEASE_RETRY_S, the wait between two looks at a held lease.
        return self.max_requeues or self.max_time_limit_s // 5 + 100
