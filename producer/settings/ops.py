"""Metrics, cost, spot notices, cancel polling, the ledger and the operator CLI."""

from __future__ import annotations

from ipaddress import IPv4Address
from typing import Literal

from pydantic import BaseModel, Field, IPvAnyAddress, SecretStr

from producer.ports import DEFAULT_EXPORTER_PORT, DEFAULT_METRICS_PORT


class OpsSettings(BaseModel):
    """What operators watch and pay, and how the CLI behaves."""

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
    ledger_uri: str | None = Field(
        default=None, pattern=r"^(s3://[^/\s]+|file:///)\S*$",
        description="s3:// or file:// prefix of the durable job and cost ledger; unset: none")
    wait_outage_s: float = Field(default=120.0, ge=0, le=86_400, description="how long `wait` "
                                 "rides out a broker or backend that stops answering, and a "
                                 "submit whose job is claimed waits to send its message")
    idle_hint_s: float = Field(default=30.0, ge=1, le=86_400, description="a job queued this "
                               "long, no job taken for as long: `status` and `wait` hint why")
    flower_basic_auth: SecretStr | None = Field(default=None, description="`framefleet "
                                                "flower`'s login: user:password[,user:password]")

    @property
    def metrics_tenant_names(self) -> frozenset[str] | None:
        """The tenants of ``metrics_tenants``; None means every tenant (``*``)."""
        if self.metrics_tenants == "*":
            return None
        return frozenset(name for name in self.metrics_tenants.split(",") if name)
