"""``make test``: the suite in three passes (``tests/parallel.py`` says which test goes where).

1. the tests that may run side by side, over ``--workers`` pytest-xdist workers;
2. the serial tests' two lanes, ``faults`` and ``first-hour``, side by side: two pytest
   processes, each its own session (its own Redis and SeaweedFS, its own ``--basetemp``, its
   own database of a Redis the user gave: ``FRAMEFLEET_TEST_SLOT``), each running its tests one
   at a time. The lanes are processes, not xdist groups: pytest 9 ignores the node ids that
   xdist's ``--dist loadgroup`` rewrites, so a group's tests landed on both workers;
3. the tests that busy every core, alone.

Each pass runs whatever the others' results and ends with its slowest tests (the arguments
after the options go to every pass, ``--durations=20`` and any paths). pytest's 5 (no test
selected) is not a failure, unless no pass selected any test. A lane's output is written to a
file while it runs and printed, whole, when it ends. Ctrl-C ends the lanes too (by PID).

    python -m tests.passes --workers 2 --durations=20 [pytest args...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

NO_TESTS = 5

#: (name, -m expression, FRAMEFLEET_TEST_SLOT) of the second pass's lanes
LANES = (("first-hour", "not gpu and first_hour_lane", 0),
         ("faults", "not gpu and faults_lane", 1))


def pytest(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", *args]


def run_lanes(extra: list[str]) -> list[int]:
    """Both lanes at once; their exit codes."""
    with tempfile.TemporaryDirectory(prefix="framefleet-lanes-") as tmp:
        procs = []
        try:
            for name, expr, slot in LANES:
                log = Path(tmp, f"{name}.log").open("wb")
                env = {**os.environ, "FRAMEFLEET_TEST_SLOT": str(slot)}
                procs.append((name, log, subprocess.Popen(
                    pytest("-m", expr, f"--basetemp={Path(tmp, name)}", *extra),
                    stdout=log, stderr=subprocess.STDOUT, env=env)))
            codes = []
            for name, log, proc in procs:
                codes.append(proc.wait())
                log.close()
                sys.stdout.write(f"\n===== lane {name}: pytest exit {codes[-1]} =====\n")
                sys.stdout.write(Path(log.name).read_text(errors="replace"))
                sys.stdout.flush()
            return codes
        finally:
            for _, log, proc in procs:  # Ctrl-C, or an error here: no lane outlives the run
                if proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(30)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
                log.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=0, help="pytest-xdist workers of pass 1")
    args, extra = ap.parse_known_args(argv)
    codes = [subprocess.run(pytest("-m", "not gpu and not serial", "-n", str(args.workers),
                                   "--dist", "loadfile", *extra), check=False).returncode]
    codes += run_lanes(extra)
    codes.append(subprocess.run(pytest("-m", "not gpu and alone", *extra),
                                check=False).returncode)
    print(f"make test: pass exit codes {codes} (pass 1, lanes {[n for n, _, _ in LANES]}, "
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
