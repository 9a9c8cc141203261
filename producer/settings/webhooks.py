"""Webhook signing, the allow-list, timeouts, retries and the queue."""

from __future__ import annotations

from pydantic import BaseModel, Field, SecretStr, field_validator

from producer.webhooks.hosts import HostError, parse_entries


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
        description="comma-separated webhook allow-list: scheme://host[:port][/path] entries "
        "(host: name, *.suffix, IP, [network]), or host-only entries (name, *.suffix, IP, CIDR) "
        "that allow the scheme's default port (443/80) only; empty: any public host on the "
        "default port. Non-public addresses only inside a network of a matching entry",
    )
    webhook_timeout_s: float = Field(
        default=5.0, gt=0, le=60, description="deadline of one delivery attempt, all of it: "
        "connect, TLS, sending and every read of the answer (a receiver that trickles bytes "
        "is cut off at it)",
    )
    webhook_threads: int = Field(
        default=4, ge=1, le=64, description="webhook delivery threads per worker process; "
        "one receiver (scheme, host, port) is served by one of them at a time, in order",
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

    @field_validator("webhook_hosts")
    @classmethod
    def _entries(cls, value: str) -> str:
        try:
            parse_entries(value)
        except HostError as e:
            raise ValueError(str(e)) from None
        return value
