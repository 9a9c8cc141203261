"""The passes of ``make test`` (``tests/parallel.py``) name real modules, and a test that busies
every core runs alone: beside another lane, or among the parallel tests, its spinning
processes would take the cores that the other tests' timings count on."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.parallel import ALONE_MODULES, FAULT_MODULES, SERIAL_MODULES, SLOW_FIRST

ROOT = Path(__file__).resolve().parents[1]


def test_every_listed_module_exists_and_is_in_one_pass() -> None:
    listed = [*SERIAL_MODULES, *FAULT_MODULES, *ALONE_MODULES]
    for module in listed:
        assert (ROOT / module).is_file(), module
    assert len(set(listed)) == len(listed)
    for module in SLOW_FIRST:  # the xdist pass's modules, put first
        assert (ROOT / module).is_file() and module not in listed, module


def test_every_test_that_busies_every_core_runs_alone() -> None:
    busy = {str(path.relative_to(ROOT)) for path in (ROOT / "tests").rglob("test_*.py")
            if re.search(r"\bbusy_cores\(", path.read_text())}
    assert busy, "no test uses tests.cpuload.busy_cores: this check checks nothing"
    assert busy <= ALONE_MODULES, busy - ALONE_MODULES


def test_the_run_fails_if_any_pass_fails_and_selects_nothing_only_if_none_selects() -> None:
    from tests.passes import overall

    assert overall([0, 5, 0, 5]) == 0  # a lane with nothing selected is no failure
    assert overall([0, 0, 1, 0]) == 1
    assert overall([5, 2, 1, 0]) == 2  # the first failure's code
    assert overall([5, 5, 5, 5]) == 5


def test_sessions_running_at_once_have_distinct_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.parallel import own_database, worker_index
    from tests.passes import LANES, WORKER_SLOTS_FROM

    seen = []
    for _, _, slot in LANES:  # each lane: its slot, no xdist worker
        monkeypatch.setenv("FRAMEFLEET_TEST_SLOT", str(slot))
        monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
        seen.append(worker_index())
    monkeypatch.setenv("FRAMEFLEET_TEST_SLOT", str(WORKER_SLOTS_FROM))
    for gw in range(4):  # the xdist pass's workers, beside the lanes
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{gw}")
        seen.append(worker_index())
    assert len(set(seen)) == len(seen), seen
    assert own_database("redis://127.0.0.1:6379/3") == f"redis://127.0.0.1:6379/{3 + seen[-1]}"


def test_the_run_ends_with_the_slowest_tests_of_every_pass_and_their_walls() -> None:
    # Given one fast test, run through every pass (the lanes and the alone pass select nothing)
    node = ("tests/test_parallel.py::"
            "test_the_run_fails_if_any_pass_fails_and_selects_nothing_only_if_none_selects")
    done = subprocess.run([sys.executable, "-m", "tests.passes", "--workers", "0", "-q",
                           "-p", "no:cacheprovider", node], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False)
    out = done.stdout
    # Then the run passed, and its end names that test with its seconds and every pass's wall
    assert done.returncode == 0, out[-3000:] + done.stderr[-2000:]
    tail = out[out.index("===== make test: the 1 slowest tests of all passes"):]
    assert re.search(r"\n +[0-9.]+s +xdist  tests\.test_parallel::test_the_run_fails_if_any_pass",
                     tail), tail
    walls = re.search(r"make test: wall (.*)", tail)
    assert walls and {w.rsplit(" ", 1)[0] for w in walls[1].split(", ")} == {
        "alone", "faults", "first-hour", "xdist"}, tail
    assert "pass exit codes [0, 5, 5, 5]" in tail, tail
