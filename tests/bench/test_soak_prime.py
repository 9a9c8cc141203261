"""bench/soak/soak_prime.py on the CPU (``--tiny``: the device call's ``--soak --bench`` on the tiny
presets): the parallel children build, adopt and run each task's sizes through the worker's path,
and the parent collects one record per task (a failing task is counted, not hidden; a tier the
device lacks is skipped with the worker's reason)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _prime(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FRAMEFLEET_COMPILE_CACHE_DIR": str(out / "cc")}
    script = ROOT / "bench" / "soak" / "soak_prime.py"
    return subprocess.run([sys.executable, str(script), "--out", str(out), *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300, check=False)


def test_the_device_calls_tasks_run_their_sizes_and_are_recorded(tmp_path: Path) -> None:
    """``STAGE=prime``'s options (``--soak --bench``) on the tiny presets: each task's process
    builds, adopts and runs its sizes; the fp8 tasks get the worker's refusal, no process."""
    from bench.soak.soak_prime import TINY_BENCH, TINY_SOAK

    done = _prime(tmp_path, "--soak", "--bench", "--tiny")
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads((tmp_path / "soak-prime.json").read_text())
    assert sorted(t["task"] for t in doc["tasks"]) == sorted(TINY_SOAK + TINY_BENCH)
    for t in doc["tasks"]:
        _, tier, sizes = t["task"].split(":")
        if tier == "fp8":
            assert t["skipped"].startswith("generate.tier: fp8 needs a GPU"), t
            continue
        assert "error" not in t and "skipped" not in t and t["build_s"] > 0, t
        assert {f"{s}_s" for s in sizes.split(",")} <= set(t), t
    assert "primed 5/8 tasks" in done.stdout and "3 skipped" in done.stdout


def test_a_failing_task_fails_the_run(tmp_path: Path) -> None:
    done = _prime(tmp_path, "--device", "cpu", "--stagger-s", "0", "--task",
                  "no-such-preset:exact:32x48x9")
    assert done.returncode == 1
    doc = json.loads((tmp_path / "soak-prime.json").read_text())
    assert doc["tasks"][0]["error"].startswith("exit ")
    assert "primed 0/1 tasks" in done.stdout
