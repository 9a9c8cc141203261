"""The delivery caps and the output prefix in the settings: defaults and range checks."""

from __future__ import annotations

import pytest

from producer.errors import SettingsError
from producer.settings import Settings


def test_defaults() -> None:
    s = Settings()
    assert s.max_worker_losses == 3 and s.output_prefix is None


@pytest.mark.parametrize(("field", "value"), [
    ("max_worker_losses", 0), ("max_worker_losses", 101), ("max_requeues", 0),
    ("output_prefix", "videos"), ("output_prefix", "http://bucket/videos"),
    ("output_prefix", "s3:///videos"), ("output_prefix", "file://relative/path"),
])
def test_out_of_range_values_are_refused_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(SettingsError, match="FRAMEFLEET_" + field.upper()):
        Settings(**{field: value})


def test_output_prefix_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRAMEFLEET_OUTPUT_PREFIX", "s3://framefleet/videos")
    assert Settings().output_prefix == "s3://framefleet/videos"
