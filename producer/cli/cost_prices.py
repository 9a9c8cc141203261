"""``framefleet cost prices``: the price catalog with its sources, or one instance type's."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Annotated, Literal

import typer
from rich import box
from rich.table import Table

from producer.cli.output import fail
from producer.cli.output import tables as console
from producer.cost.pricing import Catalog, format_usd, load_catalog, prices_for
from producer.errors import PricingError
from producer.settings import get_settings


def _catalog(pricing_file: Path | None) -> Catalog:
    path = pricing_file if pricing_file is not None else get_settings().pricing_file
    return load_catalog(path)


def prices(
    instance_type: Annotated[
        str | None, typer.Option(help="Show the prices one worker on this type pays.")
    ] = None,
    capacity: Annotated[str, typer.Option(help="'on-demand' or 'spot'.")] = "on-demand",
    pricing_file: Annotated[
        Path | None, typer.Option(help="JSON/TOML override (default: FRAMEFLEET_PRICING_FILE).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """The price catalog with its sources, or the prices of one instance type."""
    if capacity not in ("on-demand", "spot"):
        fail(ValueError(f"--capacity must be 'on-demand' or 'spot', got {capacity!r}"))
    cap: Literal["on-demand", "spot"] = "spot" if capacity == "spot" else "on-demand"
    try:
        catalog = _catalog(pricing_file)
        if instance_type is not None:
            chosen = prices_for(instance_type, cap, catalog)
    except (PricingError, ValueError) as e:
        fail(e)
        return
    if instance_type is not None:
        if as_json:
            sys.stdout.write(chosen.model_dump_json(indent=2) + "\n")
            return
        console.print(
            f"{chosen.instance_type} ({chosen.region}, {chosen.capacity}): "
            f"{format_usd(chosen.instance_usd_per_hour)}/h for {chosen.gpus_per_instance} GPU(s)"
            f" = {format_usd(chosen.instance_usd_per_hour / chosen.gpus_per_instance)}"
            " per GPU-hour",
            highlight=False,
        )
        console.print(
            f"S3: {format_usd(chosen.s3_put_usd_per_1000)} per 1000 PUT, "
            f"{format_usd(chosen.s3_storage_usd_per_gb_month)} per GB-month",
            highlight=False,
        )
        for source in chosen.sources:
            console.print(f"  source: {source}", highlight=False)
        return
    entries = sorted(catalog.instances.values(), key=lambda e: (e.on_demand_usd_per_hour, e.gpus))
    if as_json:
        doc = {
            "instances": [dataclasses.asdict(e) for e in entries],
            "s3": dataclasses.asdict(catalog.s3),
            "spot_discount": catalog.spot_discount,
        }
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    table = Table(title=f"instance prices ({cap})", title_justify="left", box=box.SIMPLE_HEAD,
                  pad_edge=False, collapse_padding=True)
    for name in ("type", "region", "GPUs", "$/h", "$/GPU-h", "source"):
        right = name.startswith(("$", "GPU"))
        table.add_column(name, justify="right" if right else "left", no_wrap=right)
    notes: list[str] = []  # long source strings go below the table, numbered
    for entry in entries:
        try:
            usd = prices_for(entry.instance_type, cap, catalog).instance_usd_per_hour
            cells = (format_usd(usd, sign=False), format_usd(usd / entry.gpus, sign=False))
        except PricingError:  # spot without a configured price
            cells = ("-", "-")
        spot = cap == "spot" and entry.spot_source is not None
        source = entry.spot_source if spot and entry.spot_source else entry.source
        date = entry.spot_as_of if spot and entry.spot_as_of else entry.as_of
        if source not in notes:
            notes.append(source)
        note = f"[{notes.index(source) + 1}] {date}"
        table.add_row(entry.instance_type, entry.region, str(entry.gpus), *cells, note)
    console.print(table)
    for number, source in enumerate(notes, 1):
        console.print(f"[{number}] {source}", highlight=False, markup=False)
    s3 = catalog.s3
    console.print(
        f"S3 Standard {s3.region}: {format_usd(s3.put_usd_per_1000)} per 1000 PUT, "
        f"{format_usd(s3.storage_usd_per_gb_month)} per GB-month ({s3.source}, {s3.as_of})",
        highlight=False, markup=False,
    )
    if cap == "spot" and catalog.spot_discount is None:
        console.print(
            'spot prices without an entry: set them in the pricing file, e.g. '
            '[instances."g7e.2xlarge"] spot_usd_per_hour = 1.45 (see producer/cost/pricing.py)',
            highlight=False, markup=False,
        )
