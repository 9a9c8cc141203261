"""The price catalog: built-in entries and their sources, spot rules, the override file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from producer.cost.pricing import default_catalog, load_catalog, prices_for
from producer.errors import (
    FatalJobError,
    FramefleetError,
    PricingError,
    RetryableError,
    UnknownInstanceTypeError,
)
from tests.producer.cost.test_cost import close

# --- catalog ----------------------------------------------------------------------------------


def test_default_catalog_has_the_g7e_sizes_with_dated_sources() -> None:
    catalog = default_catalog()
    gpus = {"2xlarge": 1, "4xlarge": 1, "8xlarge": 1, "12xlarge": 2, "24xlarge": 4, "48xlarge": 8}
    for size, count in gpus.items():
        entry = catalog.instances[f"g7e.{size}"]
        assert entry.gpus == count
        assert entry.on_demand_usd_per_hour > 0
        assert entry.source and entry.as_of[:4].isdigit()
    assert catalog.instances["g7e.2xlarge"].on_demand_usd_per_hour == 3.36
    assert catalog.instances["g7e.2xlarge"].region == "us-east-2"
    assert (catalog.s3.put_usd_per_1000, catalog.s3.storage_usd_per_gb_month) == (0.005, 0.023)


def test_prices_name_every_source() -> None:
    prices = prices_for("g7e.48xlarge", "on-demand", default_catalog())
    assert prices.gpus_per_instance == 8
    assert prices.instance_usd_per_hour == 33.14432
    assert len(prices.sources) == 2
    assert "g7e.48xlarge" in prices.sources[0] and "2026-" in prices.sources[0]
    assert "S3 Standard" in prices.sources[1] and "2026-" in prices.sources[1]


def test_unknown_instance_type_is_a_clear_value_error() -> None:
    with pytest.raises(UnknownInstanceTypeError, match=r"'p9\.huge'") as info:
        prices_for("p9.huge", "on-demand", default_catalog())
    assert isinstance(info.value, ValueError) and isinstance(info.value, FramefleetError)


def test_a_pricing_error_fails_a_job_at_once() -> None:
    # A retry would read the same catalog: pricing errors are fatal, never retried.
    with pytest.raises(FatalJobError):
        prices_for("g7e.2xlarge", "spot", default_catalog())
    assert not issubclass(PricingError, RetryableError)


def test_spot_without_a_configured_price_is_an_error() -> None:
    with pytest.raises(PricingError, match=r"no spot price for 'g7e\.2xlarge'"):
        prices_for("g7e.2xlarge", "spot", default_catalog())


# --- override file ----------------------------------------------------------------------------


def test_toml_override_changes_prices_and_names_its_source(tmp_path: Path) -> None:
    path = tmp_path / "prices.toml"
    path.write_text(
        """
[instances."g7e.2xlarge"]
on_demand_usd_per_hour = 3.0
spot_usd_per_hour = 1.25
source = "rate card"
as_of = 2026-10-01

[instances."g7e.96xlarge"]
on_demand_usd_per_hour = 60.0
gpus = 16
region = "us-west-2"

[s3]
storage_usd_per_gb_month = 0.02
"""
    )
    catalog = load_catalog(path)
    spot = prices_for("g7e.2xlarge", "spot", catalog)
    assert spot.instance_usd_per_hour == 1.25
    assert any("rate card (2026-10-01)" in s for s in spot.sources)
    assert prices_for("g7e.2xlarge", "on-demand", catalog).instance_usd_per_hour == 3.0
    new = prices_for("g7e.96xlarge", "on-demand", catalog)
    assert (new.gpus_per_instance, new.region) == (16, "us-west-2")
    # Entries without a source are labelled with the file name.
    assert any("prices.toml" in s for s in new.sources)
    assert new.s3_storage_usd_per_gb_month == 0.02 and new.s3_put_usd_per_1000 == 0.005
    # Untouched entries keep the built-in figures.
    assert prices_for("g7e.4xlarge", "on-demand", catalog).instance_usd_per_hour == 3.99816


def test_json_override_with_spot_discounts(tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    data = {
        "spot_discount": 0.5,
        "source": "team estimate",
        "as_of": "2026-10-02",
        "instances": {"g7e.12xlarge": {"spot_discount": 0.25}},
    }
    path.write_text(json.dumps(data))
    catalog = load_catalog(path)
    own = prices_for("g7e.12xlarge", "spot", catalog)
    assert close(own.instance_usd_per_hour, 8.28608 * 0.75)
    default = prices_for("g7e.2xlarge", "spot", catalog)
    assert close(default.instance_usd_per_hour, 3.36 * 0.5)
    assert any("team estimate (2026-10-02)" in s for s in default.sources)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"instances": {"g7e.2xlarge": {"on_demand_usd_per_hr": 1}}}, "on_demand_usd_per_hr"),
        ({"instances": {"g7e.2xlarge": {"on_demand_usd_per_hour": -1}}}, "on_demand_usd"),
        ({"instances": {"g7e.2xlarge": {"spot_discount": 1.5}}}, "spot_discount"),
        ({"instances": {"new.type": {"on_demand_usd_per_hour": 1.0}}}, "needs"),
        ({"s3": {"put_usd_per_1000": "cheap"}}, "put_usd_per_1000"),
    ],
)
def test_invalid_override_names_the_entry(tmp_path: Path, data: object, match: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PricingError, match=match):
        load_catalog(path)


def test_unparsable_or_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[instances\n")
    with pytest.raises(PricingError, match=r"bad\.toml"):
        load_catalog(bad)
    with pytest.raises(PricingError, match="not found"):
        load_catalog(tmp_path / "absent.json")
