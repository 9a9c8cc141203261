"""``framefleet cost``: results read back from a real Redis backend, as Celery stores them."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from typer.testing import CliRunner

from producer.app import make_app
from producer.cli.cost import PLOT_MISSING, cost_app, parse_duration, read_held, read_results
from producer.cost.fleet import fleet_summary
from producer.cost.pricing import default_catalog, format_usd, prices_for
from producer.errors import UnsupportedBackendError
from producer.state.keys import HELD_PREFIX
from producer.wire.spec import HeldRun, JobResult
from tests.producer.cost.test_cost import make_result as cost_result
from tests.require import require_binary
from tests.services import REPO_ROOT, RedisServer

runner = CliRunner()
HOUR = 3600.0


@pytest.fixture(scope="module")
def backend_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A throwaway Redis of its own: reports read every result in the database."""
    binary = require_binary(
        "redis-server", "the redis-server package (apt-get install redis-server)"
    )
    server = RedisServer(binary, tmp_path_factory.mktemp("redis-cost"))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def app(backend_url: str) -> Iterator[Celery]:
    app = make_app(broker_url=backend_url, backend_url=backend_url)
    app.backend.client.flushdb()
    try:
        yield app
    finally:
        app.close()


def make_result(job_id: str, tenant: str, node: str, age_s: float, wall_s: float) -> JobResult:
    """test_cost's JobResult factory, priced as g7e.2xlarge on demand, finished ``age_s`` ago."""
    return cost_result(
        job_id, tenant, node=node, finished_at=time.time() - age_s, wall_s=wall_s,
        video_seconds=wall_s / 2, prices=prices_for("g7e.2xlarge", "on-demand", default_catalog()),
        s3_puts=2, stored_bytes=2_000_000,
    )


def store(app: Celery, results: list[JobResult]) -> None:
    """Store results exactly the way a Celery worker does, plus tasks that are not ours."""
    for result in results:
        app.backend.store_result(str(uuid.uuid4()), result.model_dump(mode="json"), "SUCCESS")
    app.backend.store_result(str(uuid.uuid4()), {"unrelated": 1}, "SUCCESS")
    app.backend.store_result(str(uuid.uuid4()), ValueError("boom"), "FAILURE")
    app.backend.store_result(
        str(uuid.uuid4()), {"frames_done": 1, "frames_total": 2, "segments_done": 0}, "PROGRESS"
    )


@pytest.fixture
def stored(app: Celery) -> list[JobResult]:
    results = [
        make_result("a1", "acme", "gpu0@h", age_s=2 * HOUR, wall_s=120),
        make_result("a2", "acme", "gpu1@h", age_s=1 * HOUR, wall_s=60),
        make_result("b1", "beta", "gpu0@h", age_s=0.5 * HOUR, wall_s=240),
        make_result("old", "acme", "gpu0@h", age_s=72 * HOUR, wall_s=30),  # outside 24h
    ]
    store(app, results)
    return results


def test_parse_duration() -> None:
    assert parse_duration("90m") == 5400
    assert parse_duration("24h") == 86_400
    assert parse_duration("1.5d") == 129_600
    assert parse_duration("all") is None
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration("yesterday")


def test_read_results_keeps_successful_job_results_in_the_window(
    app: Celery, stored: list[JobResult]
) -> None:
    everything = read_results(app)
    assert [r.manifest.job_id for r in everything] == ["old", "a1", "a2", "b1"]  # oldest first
    assert everything[1] == stored[0]  # round trip through Celery's JSON is exact
    recent = read_results(app, since=time.time() - 24 * HOUR)
    assert [r.manifest.job_id for r in recent] == ["a1", "a2", "b1"]


def test_read_results_refuses_a_backend_it_cannot_scan() -> None:
    app = make_app(broker_url="memory://", backend_url="cache+memory://")
    try:
        with pytest.raises(UnsupportedBackendError, match="Redis result backend"):
            read_results(app)
    finally:
        app.close()


def test_report_json_matches_the_fleet_summary(backend_url: str, stored: list[JobResult]) -> None:
    result = runner.invoke(cost_app, ["report", "--backend", backend_url, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    expected = fleet_summary(stored[:3], by="tenant", fleet_gpu_hours=None)
    assert doc["jobs"] == 3
    assert [r["group"] for r in doc["rows"]] == ["acme", "beta"]
    for got, want in zip(doc["rows"], expected, strict=True):
        assert got["jobs"] == want.jobs
        assert got["direct_usd"] == pytest.approx(want.direct_usd, rel=1e-12)
        # The window is inferred from the stored times: same jobs, same fleet GPU-hours.
        assert got["adjusted_usd"] == pytest.approx(want.adjusted_usd, rel=1e-9)
    acme = doc["rows"][0]
    # Hand check: acme held 180 GPU-s at $3.36/h and produced 90 s of video.
    assert acme["direct_gpu_usd"] == pytest.approx(180 * 3.36 / 3600, rel=1e-12)
    assert acme["video_minutes"] == pytest.approx(1.5)
    assert doc["total"]["jobs"] == 3
    assert any("g7e.2xlarge" in s for s in doc["prices"])


def test_report_table_csv_and_plot(
    backend_url: str, stored: list[JobResult], tmp_path: Path
) -> None:
    table = runner.invoke(cost_app, ["report", "--backend", backend_url, "--since", "7d"])
    assert table.exit_code == 0, table.output
    for text in ("acme", "beta", "total", "utilisation", "g7e.2xlarge on-demand"):
        assert text in table.stdout
    plot = tmp_path / "cost.png"
    out = runner.invoke(
        cost_app,
        ["report", "--backend", backend_url, "--csv", "--plot", str(plot), "--bucket", "30m"],
    )
    assert out.exit_code == 0, out.output
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    assert [r["group"] for r in rows] == ["acme", "beta", "(total)"]
    assert int(rows[2]["jobs"]) == 3
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 5000


def test_report_on_an_empty_backend_and_bad_options(app: Celery, backend_url: str) -> None:
    empty = runner.invoke(cost_app, ["report", "--backend", backend_url])
    assert empty.exit_code == 0 and "no finished jobs" in empty.stdout
    both = runner.invoke(cost_app, ["report", "--backend", backend_url, "--json", "--csv"])
    assert both.exit_code == 1 and "exclude each other" in both.output
    since = runner.invoke(cost_app, ["report", "--backend", backend_url, "--since", "soon"])
    assert since.exit_code == 1 and "not a duration" in since.output
    memory = runner.invoke(cost_app, ["report", "--backend", "cache+memory://"])
    assert memory.exit_code == 1 and "not supported" in memory.output


def test_prices_lists_the_catalog_and_one_type(tmp_path: Path) -> None:
    listing = runner.invoke(cost_app, ["prices"])
    assert listing.exit_code == 0, listing.output
    for size in ("2xlarge", "4xlarge", "8xlarge", "12xlarge", "24xlarge", "48xlarge"):
        assert f"g7e.{size}" in listing.stdout
    assert "2026-05-19" in listing.stdout
    override = tmp_path / "prices.toml"
    override.write_text('[instances."g7e.2xlarge"]\nspot_usd_per_hour = 1.5\nsource = "quote"\n')
    args = ["--instance-type", "g7e.2xlarge", "--capacity", "spot", "--json"]
    one = runner.invoke(cost_app, ["prices", *args, "--pricing-file", str(override)])
    assert one.exit_code == 0, one.output
    prices = json.loads(one.stdout)
    assert prices["instance_usd_per_hour"] == 1.5 and prices["capacity"] == "spot"
    unknown = runner.invoke(cost_app, ["prices", "--instance-type", "m9.mega"])
    assert unknown.exit_code == 1 and "'m9.mega'" in unknown.output


# --- runs without a result, layout, wording ---------------------------------------------------


def held_run(job_id: str, tenant: str, status: str, gpu_seconds: float, age_s: float,
             node: str = "gpu0@h", device: str = "cuda:0") -> HeldRun:
    end = time.time() - age_s
    return HeldRun(
        job_id=job_id, tenant=tenant, status=status,  # type: ignore[arg-type]
        reason="StorageError", node=node, device=device, started_at=end - gpu_seconds,
        finished_at=end, gpu_seconds=gpu_seconds,
        prices=prices_for("g7e.2xlarge", "on-demand", default_catalog()),
    )


def store_held(app: Celery, runs: list[HeldRun]) -> None:
    """Store HeldRun records as a worker does: JSON under HELD_PREFIX, with an expiry."""
    for run in runs:
        key = f"{HELD_PREFIX}{run.job_id}:{uuid.uuid4().hex[:12]}"
        app.backend.client.set(key, run.model_dump_json(), ex=3600)
    app.backend.client.set(f"{HELD_PREFIX}garbage:0", b"{not a record")


@pytest.fixture
def with_held(app: Celery, stored: list[JobResult]) -> list[HeldRun]:
    runs = [
        held_run("a3", "acme", "failure", gpu_seconds=90, age_s=HOUR),
        held_run("a3", "acme", "retry", gpu_seconds=30, age_s=1.5 * HOUR),
        held_run("c1", "cold", "cancelled", gpu_seconds=6, age_s=0.2 * HOUR, node="cpu0@h",
                 device="cpu"),
        held_run("z0", "acme", "failure", gpu_seconds=10, age_s=72 * HOUR),  # outside 24h
    ]
    store_held(app, runs)
    return runs


def test_failed_retried_and_cancelled_gpu_time_is_in_the_report(
    backend_url: str, stored: list[JobResult], with_held: list[HeldRun]
) -> None:
    out = runner.invoke(cost_app, ["report", "--backend", backend_url, "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["jobs"] == 3 and doc["held_runs"] == 3
    rows = {r["group"]: r for r in doc["rows"]}
    acme, cold = rows["acme"], rows["cold"]
    assert (acme["failed_runs"], acme["retried_runs"], acme["cancelled_runs"]) == (1, 1, 0)
    assert acme["held_gpu_hours"] == pytest.approx(120 / HOUR)
    assert acme["held_usd"] == pytest.approx(120 * 3.36 / HOUR, rel=1e-12)
    # A tenant with no successful job still has its row: its GPU time was paid for.
    assert (cold["jobs"], cold["cancelled_runs"], cold["cpu_runs"]) == (0, 1, 1)
    # Busy time is every run's: 420 s of results + 126 s held.
    total = doc["total"]
    assert total["utilisation"] == pytest.approx((420 + 126) / HOUR / total["fleet_gpu_hours"])
    # The adjusted $ charges the held runs too: the GPU $ of all runs is spread, none lost.
    adjusted_gpu = sum(r["adjusted_gpu_usd"] for r in doc["rows"])
    assert adjusted_gpu == pytest.approx(total["fleet_gpu_hours"] * 3.36, rel=1e-9)


def _cli(*args: str, columns: int = 80) -> subprocess.CompletedProcess[str]:
    """``framefleet`` in a process of its own, its terminal ``columns`` wide."""
    env = {**os.environ, "COLUMNS": str(columns), "PYTHONPATH": str(REPO_ROOT)}
    env.pop("FORCE_COLOR", None)
    return subprocess.run([sys.executable, "-m", "producer.cli", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_report_fits_80_columns_without_cutting_a_value(
    backend_url: str, app: Celery, with_held: list[HeldRun]
) -> None:
    # A tenant name too long for its column, and amounts with many digits.
    big = make_result("big", "a-tenant-with-a-rather-long-name-eu-west", "gpu2@h", age_s=600,
                      wall_s=3_600_000)  # fmt: skip
    store(app, [big])
    done = _cli("cost", "report", "--backend", backend_url, "--since", "7d")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    assert "…" not in done.stdout
    rows = fleet_summary(read_results(app, since=time.time() - 7 * 86_400), by="tenant",
                         held=read_held(app, since=time.time() - 7 * 86_400))  # fmt: skip
    row = {r.group: r for r in rows}["a-tenant-with-a-rather-long-name-eu-west"]
    # Every amount is whole on one line, at the one precision.
    for text in (format_usd(row.direct_usd, sign=False), f"{row.busy_gpu_hours:,.4f}",
                 format_usd(row.adjusted_usd, sign=False), f"{row.video_minutes:,.2f}"):
        assert text in done.stdout, text
    # A long tenant name folds where a table is tight (never an ellipsis) and is whole where
    # there is room.
    assert "a-tenant-with-a-rather-long-name-eu-west" in done.stdout
    for words in ("runs that ended without a result", "failed", "retried", "cancelled",
                  "utilisation-adjusted", "cost of jobs finished in the last 7d"):
        assert words in done.stdout, words
    # A CPU worker's run is priced like a GPU, and the report says so.
    assert "CPU workers" in done.stdout and "not as CPU time" in done.stdout


def test_since_all_says_so(backend_url: str, stored: list[JobResult]) -> None:
    out = runner.invoke(cost_app, ["report", "--backend", backend_url, "--since", "all"])
    assert out.exit_code == 0, out.output
    assert "in the last all" not in out.stdout
    assert "cost of jobs finished at any time" in out.stdout
    assert "acme" in out.stdout and "old" not in out.stdout  # job ids are not printed


def test_empty_report_wording(app: Celery, backend_url: str) -> None:
    out = runner.invoke(cost_app, ["report", "--backend", backend_url, "--since", "all"])
    assert out.exit_code == 0 and out.stdout.strip() == (
        "no finished jobs in the result backend at any time")
    out = runner.invoke(cost_app, ["report", "--backend", backend_url, "--since", "2h"])
    assert out.stdout.strip() == "no finished jobs in the result backend in the last 2h"


def test_plot_without_matplotlib_is_one_line_naming_the_extra(
    backend_url: str, stored: list[JobResult], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # None in sys.modules: "import matplotlib" raises ImportError, as where it is missing.
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    plot = tmp_path / "cost.png"
    out = runner.invoke(cost_app, ["report", "--backend", backend_url, "--plot", str(plot)])
    assert out.exit_code == 1
    assert out.output.strip().splitlines() == [f"error: {PLOT_MISSING}"]
    assert "framefleet[plot]" in PLOT_MISSING and not plot.exists()


def test_pricing_hint_keeps_its_brackets() -> None:
    out = _cli("cost", "prices", "--instance-type", "m9.mega")
    assert out.returncode == 1
    assert '[instances."m9.mega"]' in out.stderr
    assert len(out.stderr.strip().splitlines()) <= 3 and "Traceback" not in out.stderr
    spot = _cli("cost", "prices", "--capacity", "spot")
    assert '[instances."g7e.2xlarge"]' in spot.stdout


_USD = re.compile(r"\$\s?([\d,]+(?:\.\d+)?)")


def test_prices_are_printed_at_one_precision(backend_url: str, stored: list[JobResult]) -> None:
    # Wide, so that each printed line is one line (and a quoted source is recognised).
    texts = [
        _cli("cost", "prices", columns=300).stdout,
        _cli("cost", "prices", "--instance-type", "g7e.12xlarge", columns=300).stdout,
        _cli("cost", "report", "--backend", backend_url, columns=300).stdout,
    ]
    amounts = [m for text in texts for line in text.splitlines()
               if not line.lstrip().startswith(("source:", "["))  # quoted catalog sources
               for m in _USD.findall(line)]  # fmt: skip
    assert len(amounts) >= 6
    assert all(re.fullmatch(r"[\d,]+\.\d{4}", a) for a in amounts), amounts
    table = _cli("cost", "prices").stdout
    assert "3.3600" in table and "33.1443" in table and "4.1430" in table
