"""bench/soak/soak_prime.py on the CPU: the parallel children build, adopt and run each task's sizes
through the worker's path, and the parent collects one record per task (a failing task is
counted, not hidden)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _prime(out: Path, *tasks: str) -> subprocess.CompletedProcess[str]:
    args = [a for t in tasks for a in ("--task", t)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FRAMEFLEET_COMPILE_CACHE_DIR": str(out / "cc")}
    script = ROOT / "bench" / "soak" / "soak_prime.py"
    return subprocess.run([sys.executable, str(script), "--device", "cpu",
                           "--stagger-s", "0", "--out", str(out), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def test_each_task_runs_its_sizes_and_is_recorded(tmp_path: Path) -> None:
    done = _prime(tmp_path, "tiny:exact:32x48x9,48x32x5", "tiny-ti2v:exact:32x32x9")
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads((tmp_path / "soak-prime.json").read_text())
    by_task = {t["task"]: t for t in doc["tasks"]}
    assert set(by_task["tiny:exact:32x48x9,48x32x5"]) >= {"build_s", "32x48x9_s", "48x32x5_s"}
    assert "32x32x9_s" in by_task["tiny-ti2v:exact:32x32x9"]
    assert "primed 2/2 tasks" in done.stdout


def test_a_failing_task_fails_the_run(tmp_path: Path) -> None:
    done = _prime(tmp_path, "no-such-preset:exact:32x48x9")
    assert done.returncode == 1
    doc = json.loads((tmp_path / "soak-prime.json").read_text())
    assert doc["tasks"][0]["error"].startswith("exit ")
    assert "primed 0/1 tasks" in done.stdout
