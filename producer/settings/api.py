"""`framefleet api`: the HTTP gateway."""

from __future__ import annotations

from ipaddress import IPv4Address, ip_network
from typing import Literal

from pydantic import BaseModel, Field, IPvAnyAddress, field_validator

from producer.ports import DEFAULT_API_PORT


class ApiSettings(BaseModel):
    """The gateway's address, keys, models and limits."""

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
    api_anon_rate_per_minute: int = Field(
        default=120, ge=1, le=1_000_000,
        description="requests one client address may make per minute without a valid key "
        "(an IPv6 client: its /64), across every replica (429 beyond); /healthz and /readyz "
        "are exempt",
    )
    api_trusted_proxies: str = Field(
        default="127.0.0.1",
        description="comma-separated addresses or CIDR networks of the proxies (the load "
        "balancer) whose X-Forwarded-For names the client; the limits count that client's "
        "address. Only what these proxies add is believed",
    )
    api_max_streams: int = Field(
        default=8, ge=1, le=10_000,
        description="Server-Sent Events streams one tenant may hold open at once, across every "
        "replica (429 with Retry-After beyond); a key in the keys file may set its own",
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
        description="another hls.min.js for the page to serve; unset: the one the package "
        "ships (hls.js 1.7.4, producer/api/static/hls.min.js). A file that cannot be read "
        "is named when framefleet api starts, and the page says it cannot play",
    )
    api_events_poll_s: float = Field(
        default=0.5, ge=0.05, le=10, description="how often a job's event stream reads its state"
    )

    @field_validator("api_trusted_proxies")
    @classmethod
    def _proxies(cls, v: str) -> str:
        for part in (p.strip() for p in v.split(",")):
            try:
                ip_network(part)  # an address, or a network without host bits (as uvicorn)
            except ValueError:
                raise ValueError(f"{part!r} is not an IP address or a CIDR network") from None
        return v

    @property
    def api_trusted_proxy_list(self) -> list[str]:
        """FRAMEFLEET_API_TRUSTED_PROXIES, one address or network each."""
        return [p.strip() for p in self.api_trusted_proxies.split(",")]
