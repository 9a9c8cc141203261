"""Webhook signing, the allow-list, timeouts, retries and the queue."""

from __future__ import annotations

from pydantic import BaseModel, Field, SecretStr


class WebhookSettings(BaseModel):
    """How job events reach receivers."""

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
