"""The dated price catalog, its override file, and the prices one GPU worker pays.

The only I/O is :func:`load_catalog`, which reads an optional JSON or TOML file that overrides
any catalog entry. Every price carries where it came from and when; those strings travel in
``Prices.sources`` so every :class:`~producer.wire.spec.CostReport` names the prices it used.

Override file (JSON with the same shape, or TOML)::

    spot_discount = 0.6                  # default for every type without its own spot price

    [instances."g7e.2xlarge"]
    on_demand_usd_per_hour = 3.10        # any field may be given; the others keep the catalog's
    spot_usd_per_hour = 1.45             # or spot_discount = 0.55 (fraction off on-demand)
    source = "our EDP rate card"
    as_of = "2026-10-01"

    [instances."g7e.96xlarge"]           # a new type needs on_demand_usd_per_hour and gpus
    on_demand_usd_per_hour = 60.0
    gpus = 16

    [s3]
    put_usd_per_1000 = 0.005
    storage_usd_per_gb_month = 0.0225
"""

from __future__ import annotations

import datetime as dt
import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from producer.errors import PricingError, UnknownInstanceTypeError
from producer.wire.spec import Prices

Capacity = Literal["on-demand", "spot"]

#: Decimals of every dollar amount the CLI prints (JSON and CSV keep full precision).
USD_DECIMALS = 4


def format_usd(value: float, *, sign: bool = True) -> str:
    """A dollar amount as the CLI prints it, always to :data:`USD_DECIMALS` decimals and with
    thousands separators: ``$3.3600``, ``$1,234.5678`` (``sign=False``: without the ``$``,
    for table columns whose header names the unit)."""
    text = f"{value:,.{USD_DECIMALS}f}"
    return f"${text}" if sign else text


@dataclass(frozen=True)
class InstancePrice:
    """One EC2 instance type: on-demand $/h, GPUs per instance, optional spot price."""

    instance_type: str
    region: str
    gpus: int
    on_demand_usd_per_hour: float
    source: str
    as_of: str
    spot_usd_per_hour: float | None = None
    spot_discount: float | None = None
    spot_source: str | None = None
    spot_as_of: str | None = None


@dataclass(frozen=True)
class S3Price:
    """S3 Standard request and storage prices."""

    region: str
    put_usd_per_1000: float
    storage_usd_per_gb_month: float
    source: str
    as_of: str


@dataclass(frozen=True)
class Catalog:
    """Instance prices by type, S3 prices, and a default spot discount (None: no default)."""

    instances: Mapping[str, InstancePrice]
    s3: S3Price
    spot_discount: float | None = None
    spot_discount_source: str | None = None


_AWS_G7E_POST = (
    "AWS Architecture Blog, 'How Synthesia optimizes generative AI video inference on "
    "Amazon EC2 G7e instances', on-demand, us-east-2"
)
# instances.vantage.sh collects the AWS Price List; read via its export in the public
# GitHub repository tsaol/aws-gpu (data/g7e_instances.js). GPU counts agree with
# kubernetes/autoscaler issue 9854 (g7e sizes table).
_VANTAGE = (
    "instances.vantage.sh (AWS Price List export, via github.com/tsaol/aws-gpu "
    "data/g7e_instances.js), Linux on-demand, us-east-2"
)
_VANTAGE_DATE = "2026-08-26"


def _g7e(size: str, gpus: int, usd: float) -> InstancePrice:
    return InstancePrice(f"g7e.{size}", "us-east-2", gpus, usd, _VANTAGE, _VANTAGE_DATE)


def default_catalog() -> Catalog:
    """The built-in catalog. g7e.2xlarge uses the figure of the AWS post on G7e video inference.

    The same export lists g7e.2xlarge at $3.36312/h, i.e. the post's $3.36 unrounded.
    No spot price is built in: spot prices move daily, so they come from the override file.
    """
    instances = [
        InstancePrice("g7e.2xlarge", "us-east-2", 1, 3.36, _AWS_G7E_POST, "2026-05-19"),
        _g7e("4xlarge", 1, 3.99816),
        _g7e("8xlarge", 1, 5.26824),
        _g7e("12xlarge", 2, 8.28608),
        _g7e("24xlarge", 4, 16.57216),
        _g7e("48xlarge", 8, 33.14432),
    ]
    s3 = S3Price(
        region="us-east-1",
        put_usd_per_1000=0.005,
        storage_usd_per_gb_month=0.023,
        source=(
            "AWS Price List, AmazonS3 us-east-1 offer (S3 Standard: Requests-Tier1 PUT/COPY/"
            "POST/LIST per 1000; TimedStorage first 50 TB per GB-month)"
        ),
        as_of="2026-09-28",
    )
    return Catalog(MappingProxyType({i.instance_type: i for i in instances}), s3)


# ---------------------------------------------------------------------------------------------
# Override file


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    source: str | None = None
    as_of: str | dt.date | None = None


class _InstanceOverride(_Entry):
    region: str | None = None
    gpus: int | None = Field(default=None, ge=1)
    on_demand_usd_per_hour: float | None = Field(default=None, ge=0)
    spot_usd_per_hour: float | None = Field(default=None, ge=0)
    spot_discount: float | None = Field(default=None, ge=0, lt=1)

    @model_validator(mode="after")
    def _one_spot(self) -> _InstanceOverride:
        if self.spot_usd_per_hour is not None and self.spot_discount is not None:
            raise ValueError("give spot_usd_per_hour or spot_discount, not both")
        return self


class _S3Override(_Entry):
    region: str | None = None
    put_usd_per_1000: float | None = Field(default=None, ge=0)
    storage_usd_per_gb_month: float | None = Field(default=None, ge=0)


class _PricingFile(_Entry):
    spot_discount: float | None = Field(default=None, ge=0, lt=1)
    instances: dict[str, _InstanceOverride] = {}
    s3: _S3Override | None = None


def _override_instance(
    name: str, base: InstancePrice | None, o: _InstanceOverride, source: str, as_of: str
) -> InstancePrice:
    src, date = o.source or source, str(o.as_of or as_of)
    if base is None:
        if o.on_demand_usd_per_hour is None or o.gpus is None:
            raise PricingError(
                f"instances.{name}: a new instance type needs on_demand_usd_per_hour and gpus"
            )
        base = InstancePrice(name, "unspecified", o.gpus, o.on_demand_usd_per_hour, src, date)
    out = replace(base, region=o.region or base.region)
    if o.gpus is not None or o.on_demand_usd_per_hour is not None:
        out = replace(
            out,
            gpus=o.gpus or out.gpus,
            on_demand_usd_per_hour=(
                out.on_demand_usd_per_hour
                if o.on_demand_usd_per_hour is None
                else o.on_demand_usd_per_hour
            ),
            source=src,
            as_of=date,
        )
    if o.spot_usd_per_hour is not None or o.spot_discount is not None:
        out = replace(
            out,
            spot_usd_per_hour=o.spot_usd_per_hour,
            spot_discount=o.spot_discount,
            spot_source=src,
            spot_as_of=date,
        )
    return out


def apply_overrides(
    catalog: Catalog, data: Mapping[str, Any], *, source: str, as_of: str
) -> Catalog:
    """Return ``catalog`` with the entries of an override mapping (the file's shape) applied.

    ``source``/``as_of`` label every overridden price whose entry names none of its own.
    Unknown keys and invalid values raise :class:`PricingError` naming each one.
    """
    try:
        parsed = _PricingFile.model_validate(data)
    except ValidationError as e:
        lines = [f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()]
        raise PricingError("invalid pricing file: " + "; ".join(lines)) from None
    source, as_of = parsed.source or source, str(parsed.as_of or as_of)
    instances = dict(catalog.instances)
    for name, entry in parsed.instances.items():
        instances[name] = _override_instance(name, instances.get(name), entry, source, as_of)
    s3 = catalog.s3
    if parsed.s3 is not None:
        o = parsed.s3
        s3 = S3Price(
            region=o.region or s3.region,
            put_usd_per_1000=_first(o.put_usd_per_1000, s3.put_usd_per_1000),
            storage_usd_per_gb_month=_first(
                o.storage_usd_per_gb_month, s3.storage_usd_per_gb_month
            ),
            source=o.source or source,
            as_of=str(o.as_of or as_of),
        )
    spot_discount, spot_source = catalog.spot_discount, catalog.spot_discount_source
    if parsed.spot_discount is not None:
        spot_discount, spot_source = parsed.spot_discount, f"{source} ({as_of})"
    return Catalog(MappingProxyType(instances), s3, spot_discount, spot_source)


def _first(value: float | None, default: float) -> float:
    return default if value is None else value


def load_catalog(path: str | Path | None = None, base: Catalog | None = None) -> Catalog:
    """The default catalog (or ``base``) with the override file at ``path`` applied.

    ``.toml`` files are read with :mod:`tomllib`, anything else as JSON. Entries without a
    ``source`` are labelled with the file name; without ``as_of``, with the file's mtime date.
    """
    catalog = base or default_catalog()
    if path is None:
        return catalog
    file = Path(path)
    try:
        raw = file.read_bytes()
        data = tomllib.loads(raw.decode()) if file.suffix == ".toml" else json.loads(raw)
    except FileNotFoundError:
        raise PricingError(f"pricing file not found: {file}") from None
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PricingError(f"pricing file {file.name}: cannot parse: {e}") from e
    if not isinstance(data, Mapping):
        raise PricingError(f"pricing file {file.name}: must hold a table/object at the top")
    mtime = dt.datetime.fromtimestamp(file.stat().st_mtime, tz=dt.UTC).date().isoformat()
    return apply_overrides(catalog, data, source=f"pricing override file {file.name}", as_of=mtime)


# ---------------------------------------------------------------------------------------------
# Prices


def prices_for(instance_type: str, capacity: Capacity, catalog: Catalog) -> Prices:
    """The prices one GPU worker on ``instance_type`` pays, with their sources.

    Spot: the entry's ``spot_usd_per_hour``, else on-demand * (1 - its ``spot_discount``), else
    the catalog-wide ``spot_discount``; with none of these, :class:`PricingError`.
    """
    entry = catalog.instances.get(instance_type)
    if entry is None:
        known = ", ".join(sorted(catalog.instances))
        raise UnknownInstanceTypeError(
            f"unknown instance type {instance_type!r}: not in the pricing catalog "
            f'(known: {known}); add it under [instances."{instance_type}"] in the pricing file'
        )
    instance_source = (
        f"{entry.instance_type} on-demand ${entry.on_demand_usd_per_hour}/h, {entry.gpus} GPU: "
        f"{entry.source} ({entry.as_of})"
    )
    sources = [instance_source]
    usd = entry.on_demand_usd_per_hour
    if capacity == "spot":
        if entry.spot_usd_per_hour is not None:
            usd = entry.spot_usd_per_hour
            sources.append(
                f"{instance_type} spot ${usd}/h: {entry.spot_source} ({entry.spot_as_of})"
            )
        elif entry.spot_discount is not None:
            usd = entry.on_demand_usd_per_hour * (1 - entry.spot_discount)
            sources.append(
                f"{instance_type} spot = on-demand x (1 - {entry.spot_discount}): "
                f"{entry.spot_source} ({entry.spot_as_of})"
            )
        elif catalog.spot_discount is not None:
            usd = entry.on_demand_usd_per_hour * (1 - catalog.spot_discount)
            sources.append(
                f"{instance_type} spot = on-demand x (1 - {catalog.spot_discount}): "
                f"{catalog.spot_discount_source}"
            )
        else:
            raise PricingError(
                f'no spot price for {instance_type!r}: set instances."{instance_type}".'
                "spot_usd_per_hour or spot_discount (or a top-level spot_discount) in the "
                "pricing file"
            )
    elif capacity != "on-demand":
        raise PricingError(f"capacity must be 'on-demand' or 'spot', got {capacity!r}")
    s3 = catalog.s3
    sources.append(
        f"S3 Standard {s3.region} ${s3.put_usd_per_1000}/1000 PUT, "
        f"${s3.storage_usd_per_gb_month}/GB-month: {s3.source} ({s3.as_of})"
    )
    return Prices(
        instance_type=instance_type,
        region=entry.region,
        capacity=capacity,
        instance_usd_per_hour=usd,
        gpus_per_instance=entry.gpus,
        s3_put_usd_per_1000=s3.put_usd_per_1000,
        s3_storage_usd_per_gb_month=s3.storage_usd_per_gb_month,
        sources=tuple(sources),
    )
