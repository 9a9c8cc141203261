"""The watchdog's backstop (``worker.watchdog``, ``backstop``): a hang that holds the GIL
stops the Python watchdog's thread too, and faulthandler's own timer ends the process with
every thread's stack; beats keep it off, and a disarmed run leaves it off. Each case in a
process of its own: the timer is process-wide and ends the process."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from tests.services import REPO_ROOT

#: Arms a watchdog with the backstop on (a 0.5 s limit, the backstop 1 s + SLACK later).
SETUP = """
import re, sys, time
from worker.watchdog import Watchdog
w = Watchdog()
w.backstop, w.backstop_slack_s = True, {slack}
token = w.arm("job-1", 0.5, lambda stage, idle: print("recorded", stage, flush=True))
print("armed", flush=True)
"""
SLACK = 1.0


def _run(body: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], float]:
    code = SETUP.format(slack=SLACK) + textwrap.dedent(body)
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=timeout)
    return out, time.monotonic() - t0


def test_a_hang_holding_the_gil_still_ends_the_process_with_its_stacks() -> None:
    # Given an armed run whose thread then spins in C code that never lets go of the GIL
    # (a regular expression's backtracking: hours for this input)
    out, took = _run("""
        re.match(r"(a+)+$", "a" * 64 + "b")  # the hang
        print("never", flush=True)
    """)
    # Then the Python watchdog never ran (nothing recorded), yet the process ended with status
    # 1 within twice the limit and the slack, its stacks naming the line that hung
    assert "armed" in out.stdout and "recorded" not in out.stdout, out.stdout
    assert out.returncode == 1, (out.returncode, out.stderr[-2000:])
    assert took < 30, took
    assert "Timeout (" in out.stderr and 'File "<string>", line' in out.stderr, out.stderr


def test_beats_keep_the_backstop_off_and_a_disarm_cancels_it() -> None:
    # Given an armed run that beats every 0.1 s for three times the backstop's delay
    out, _ = _run(f"""
        end = time.monotonic() + 3 * (2 * 0.5 + {SLACK})
        while time.monotonic() < end:
            w.beat("denoise")
            time.sleep(0.1)
        w.disarm(token)
        time.sleep(2 * (2 * 0.5 + {SLACK}))  # disarmed: nothing fires
        print("lived", flush=True)
    """)
    # Then neither the watchdog nor its backstop ended it
    assert out.returncode == 0 and "lived" in out.stdout, (out.stdout, out.stderr[-2000:])
    assert "Timeout (" not in out.stderr and "recorded" not in out.stdout, out.stderr
