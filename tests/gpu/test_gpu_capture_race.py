"""Background builds never break a job (``pytest -m gpu``): new decode sizes arrive back to
back, their graphs queued as builds of the device owner, while generate jobs denoise and decode
on the main thread; at least 20 jobs, every one identical to a job run with nothing in the
background, and every build done between jobs (``tests/gpu/capture_race.py``, in a subprocess
of its own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
ROOT = Path(__file__).resolve().parents[2]


def _race(*args: str) -> dict[str, object]:
    # Its run is 240 s at most, then 120 s for the last builds; a hang dumps every thread's
    # stack (the stuck-job watchdog) before this test's timeout would kill it silently.
    env = {**os.environ, "FRAMEFLEET_STUCK_S": "390"}
    done = subprocess.run([sys.executable, "-m", "tests.gpu.capture_race", "--reps", "20",
                           *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=420)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, done.stdout[-2000:] + done.stderr[-12000:]
    result: dict[str, object] = json.loads(lines[-1])
    print(result)
    return result


def test_background_captures_never_break_or_change_a_job() -> None:
    result = _race()
    assert result["broken"] == 0, result
    assert result["mismatches"] == 0, result
    assert int(result["reps"]) >= 20  # type: ignore[call-overload]
    assert result["drained"] and result["closed"], result
    assert result["graphs_built"] == 6 and result["first_graphs_built"] == 6, result
    assert result["captures_failed"] == 0 and result["builds_failed"] == 0, result
