"""``make test``: the suite in two steps (``tests/parallel.py`` says which test goes where).

1. side by side, started together:
   - the tests that may run side by side, over ``--workers`` pytest-xdist workers;
   - the serial tests' two lanes, ``faults`` and ``first-hour``: two pytest processes, each its
     own session (its own Redis and SeaweedFS, its own ``--basetemp``, its own database of a
     Redis the user gave: ``FRAMEFLEET_TEST_SLOT``), each running its tests one at a time.
     The lanes mostly wait (outages, redelivery timeouts, image builds in ``dockerd``, a
     browser playing a stream: about 0.4 of a core between them on 2 cores), so they run
     beside the xdist workers rather than after them. The lanes are processes, not xdist
     groups: pytest 9 ignores the node ids that xdist's ``--dist loadgroup`` rewrites, so a
     group's tests landed on both workers;
2. the tests that busy every core, alone.

Each pass runs whatever the others' results and ends with its slowest tests (the arguments
after the options go to every pass, ``--durations=20`` and any paths). pytest's 5 (no test
selected) is not a failure, unless no pass selected any test. The xdist pass writes to the
terminal; a lane's output is written to a file while it runs and printed, whole, when the xdist
pass has ended and the lane too. The run ends with each pass's wall time and the 20 slowest
tests of all passes (setup, call and teardown together: pytest's JUnit XML reports, one per
pass). Ctrl-C ends the lanes too (by PID).

    python -m tests.passes --workers 2 --durations=20 [pytest args...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

NO_TESTS = 5

#: (name, -m expression, FRAMEFLEET_TEST_SLOT) of the lanes
LANES = (("first-hour", "not gpu and first_hour_lane", 0),
         ("faults", "not gpu and faults_lane", 1))

#: The xdist workers' FRAMEFLEET_TEST_SLOT numbers start after the lanes' (``tests/parallel.py``
#: ``worker_index``): a Redis the user gave is shared by every session of the run.
WORKER_SLOTS_FROM = len(LANES)


def pytest(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", *args]


Lane = tuple[str, IO[bytes], "subprocess.Popen[bytes]"]


@contextmanager
def lanes_running(extra: list[str], tmp: Path) -> Iterator[list[Lane]]:
    """Both lanes started, their logs and reports in ``tmp``; on the way out (Ctrl-C, an error)
    none outlives the block."""
    procs: list[Lane] = []
    try:
        for name, expr, slot in LANES:
            log = Path(tmp, f"{name}.log").open("wb")
            env = {**os.environ, "FRAMEFLEET_TEST_SLOT": str(slot)}
            procs.append((name, log, subprocess.Popen(
                pytest("-m", expr, f"--basetemp={tmp / name}", *report(tmp, name), *extra),
                stdout=log, stderr=subprocess.STDOUT, env=env)))
        yield procs
    finally:
        for _, log, proc in procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            log.close()


def lane_codes(procs: list[Lane]) -> list[int]:
    """Wait for every lane, print its output whole; their exit codes."""
    codes = []
    for name, log, proc in procs:
        codes.append(proc.wait())
        log.flush()
        sys.stdout.write(f"\n===== lane {name}: pytest exit {codes[-1]} =====\n")
        sys.stdout.write(Path(log.name).read_text(errors="replace"))
        sys.stdout.flush()
    return codes


def report(tmp: Path, name: str) -> list[str]:
    """pytest's option for a JUnit XML report of the pass ``name`` in ``tmp``."""
    return [f"--junitxml={tmp / (name + '.xml')}", "-o", "junit_duration_report=total"]


@dataclass(frozen=True)
class Timed:
    seconds: float
    test: str
    where: str


def slowest(tmp: Path, n: int) -> tuple[dict[str, float], list[Timed]]:
    """Each pass's wall time (its report's session time), and the ``n`` slowest tests of every
    JUnit XML report in ``tmp`` (a pass that did not run has none)."""
    walls, found = {}, []
    for path in sorted(tmp.glob("*.xml")):
        root = ET.parse(path).getroot()
        walls[path.stem] = sum(float(suite.get("time") or 0) for suite in root.iter("testsuite"))
        for case in root.iter("testcase"):
            test = f"{case.get('classname', '')}::{case.get('name', '')}"
            found.append(Timed(float(case.get("time") or 0), test, path.stem))
    return walls, sorted(found, key=lambda t: -t.seconds)[:n]


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=0, help="pytest-xdist workers of the xdist pass")
    args, extra = ap.parse_known_args(argv)
    with tempfile.TemporaryDirectory(prefix="framefleet-passes-") as name:
        tmp = Path(name)
        with lanes_running(extra, tmp) as lanes:
            env = {**os.environ, "FRAMEFLEET_TEST_SLOT": str(WORKER_SLOTS_FROM)}
            codes = [subprocess.run(pytest("-m", "not gpu and not serial", "-n",
                                           str(args.workers), "--dist", "loadfile",
                                           *report(tmp, "xdist"), *extra),
                                    env=env, check=False).returncode]
            codes += lane_codes(lanes)
        codes.append(subprocess.run(pytest("-m", "not gpu and alone", *report(tmp, "alone"),
                                           *extra), check=False).returncode)
        walls, tests = slowest(tmp, 20)
    print(f"\n===== make test: the {len(tests)} slowest tests of all passes "
          "(setup + call + teardown) =====")
    for timed in tests:
        print(f"{timed.seconds:8.2f}s {timed.where:>10}  {timed.test}")
    print("make test: wall " + ", ".join(f"{k} {minutes(v)}" for k, v in walls.items()))
    print(f"make test: pass exit codes {codes} (xdist pass, lanes {[n for n, _, _ in LANES]}, "
          f"alone)")
    return overall(codes)


def overall(codes: list[int]) -> int:
    """The run's exit code from the passes': the first failure's; 5 only if no pass selected
    a test; else 0."""
    failed = [c for c in codes if c not in (0, NO_TESTS)]
    if failed:
        return failed[0]
    if all(c == NO_TESTS for c in codes):
        print("make test: no test selected")
        return NO_TESTS
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
