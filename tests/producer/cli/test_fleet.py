"""``framefleet fleet`` on a host that runs two fleets (issue 54, point 2): the ready folder is
the host's, the answer is the named broker's."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from producer.cli.app import cli
from producer.settings import get_settings
from producer.state.readiness import WarmupState, process_start_time, state_dir, write_state

runner = CliRunner()
OURS, THEIRS = "redis://127.0.0.1:6390/0", "redis://:pw@10.0.0.9:6379/2"


@pytest.fixture
def two_fleets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[int, int]]:
    """This process as a ready worker process of our broker, its parent as one of another
    broker's fleet on the same host (both alive: the folder keeps live processes only)."""
    monkeypatch.setenv("FRAMEFLEET_WORK_DIR", str(tmp_path))
    monkeypatch.setenv("FRAMEFLEET_BROKER_URL", OURS)
    get_settings.cache_clear()
    folder = state_dir(get_settings())
    ours, theirs = os.getpid(), os.getppid()
    for pid, node, broker in ((ours, "cpu0@host", "127.0.0.1:6390"),
                              (theirs, "cpu0@host", "10.0.0.9:6379 db 2")):
        write_state(folder, WarmupState(pid=pid, start=process_start_time(pid) or "",
                                        node=node, broker=broker, ready=True,
                                        phases={"imports": 1.0, "total": 2.0}))
    yield ours, theirs
    get_settings.cache_clear()


def test_fleet_lists_the_named_brokers_workers_only(two_fleets: tuple[int, int]) -> None:
    ours, theirs = two_fleets
    out = runner.invoke(cli, ["fleet"])
    assert out.exit_code == 0, out.output
    # Was: both processes, the other fleet's among ours, nothing to tell them apart
    assert f"worker process {ours} (cpu0@host): ready" in out.stdout
    assert str(theirs) not in out.stdout, out.stdout
    assert ("note: 1 worker process of other brokers on this host (10.0.0.9:6379 db 2): "
            "framefleet fleet --all lists them") in out.stderr, out.stderr
    assert [s["pid"] for s in json.loads(runner.invoke(cli, ["fleet", "--json"]).stdout)] \
        == [ours]
    # --all: every row says whose it is (never a password)
    every = runner.invoke(cli, ["fleet", "--all"]).stdout
    rows = [line for line in every.splitlines() if line.startswith("worker process")]
    assert sorted(rows) == sorted([
        f"worker process {ours} (cpu0@host): ready 2.0 s after its start (imports 1.0 s), "
        "broker 127.0.0.1:6390",
        f"worker process {theirs} (cpu0@host): ready 2.0 s after its start (imports 1.0 s), "
        "broker 10.0.0.9:6379 db 2"]), every
    assert "pw" not in every
