"""``framefleet cost report`` shows the cost per stage of generate jobs (real Redis backend)."""

from __future__ import annotations

import json

import pytest
from celery import Celery
from typer.testing import CliRunner

from producer.cli.cost import cost_app
from producer.cost import with_stages
from tests.producer.cli.test_cost import app, backend_url, make_result, store

__all__ = ["app", "backend_url"]  # the fixtures, shared with test_cli_cost


def test_report_shows_each_stage_and_its_share(app: Celery, backend_url: str) -> None:
    generated = make_result("g1", "acme", "gpu0@h", age_s=60, wall_s=100)
    decoded = make_result("d1", "acme", "gpu0@h", age_s=30, wall_s=20)
    assert generated.cost is not None and decoded.cost is not None
    store(app, [
        generated.model_copy(update={"cost": with_stages(
            generated.cost, {"text_encode": 2.0, "denoise": 80.0})}),
        decoded.model_copy(update={"cost": with_stages(decoded.cost, {})}),
    ])
    out = CliRunner().invoke(cost_app, ["report", "--backend", backend_url, "--json"])
    assert out.exit_code == 0, out.output
    stages = {s["stage"]: s for s in json.loads(out.stdout)["stages"]}
    assert list(stages) == ["text_encode", "denoise", "decode", "s3"]
    assert stages["denoise"]["gpu_seconds"] == pytest.approx(80.0)
    assert stages["decode"]["gpu_seconds"] == pytest.approx(18.0 + 20.0)
    assert stages["decode"]["jobs"] == 2 and stages["denoise"]["jobs"] == 1
    assert sum(s["share"] for s in stages.values()) == pytest.approx(1.0)
    table = CliRunner().invoke(cost_app, ["report", "--backend", backend_url])
    assert table.exit_code == 0, table.output
    assert "cost per stage" in table.stdout
    denoise_line = next(line for line in table.stdout.splitlines() if "denoise" in line)
    assert f"{stages['denoise']['share']:.1%}" in denoise_line
