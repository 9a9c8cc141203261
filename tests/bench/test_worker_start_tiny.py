"""bench/startup/worker_start.py --tiny runs every row of the scale-up run on the CPU, with the
device call's options (bench/gpu_startup.sh): the published TI2V-5B layout in miniature is
written, read raw, loaded by diffusers, then the worker starts with no artifact (its
transformer compiles: a miss, no artifact), `framefleet compile` writes the artifact, and a
worker with an empty compile cache and that artifact compiles nothing (a hit); each start's
critical path adds up to its ready, each runs a first and a second job, each process exits 0
with nothing left running. On the CPU the decoder has no graphs (they are CUDA graphs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SIZE = "64x64x9"  # the tiny layout's job and warm-up size (bench/startup/start_child.py)

#: The device call's options (bench/gpu_startup.sh).
DEVICE_OPTIONS = ["--methods", "none", "--threads-list", "16"]


@pytest.mark.timeout(1200)
def test_bench_worker_start_tiny_runs_every_row(tmp_path: Path) -> None:
    from worker.lifecycle.startphases import PHASES

    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    folder = tmp_path / "model" / "wan22-ti2v-5b"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "startup" / "worker_start.py"), "--tiny", "--folder",
         str(folder), "--out", str(tmp_path / "out"), *DEVICE_OPTIONS],
        env=env, capture_output=True, text=True, timeout=1100, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads((tmp_path / "out" / "worker-start-tiny.json").read_text())
    assert {"command", "date", "device", "bytes", "raw_read", "load_methods", "compile",
            "starts", "targets"} <= set(doc)
    # the disk's own read of every weight file (5 + 3 + 1 shards)
    raw = doc["raw_read"]
    assert raw["files"] == 9 and raw["bytes"] > 0 and raw["seconds"] > 0
    # diffusers' load, the baseline, exact by its own definition
    (diffusers,) = doc["load_methods"]["rows"]
    assert diffusers["method"] == "diffusers" and diffusers["status"] == "ok"
    # framefleet compile wrote the artifact: the transformer's size, no decoder graph here
    compiled = doc["compile"]
    assert compiled["bytes"] > 0 and compiled["sizes"] == [SIZE] and compiled["graphs"] == []
    starts = doc["starts"]
    assert list(starts) == ["no_artifact", "artifact_warm"]
    # the ready line's hit and miss: no artifact compiles (and says why), the artifact serves
    assert starts["no_artifact"]["compiled"] == \
        f"exact {SIZE} miss (no artifact for tier exact)", starts["no_artifact"]["compiled"]
    assert starts["artifact_warm"]["compiled"] == f"exact {SIZE} hit"
    cache = starts["artifact_warm"]["warmup"]["exact"]["cache"][SIZE]
    assert cache["fxgraph"]["miss"] == 0 and cache["fxgraph"]["hit"] >= 1
    for name, row in starts.items():
        phases, path = row["phases"], row["critical"]
        # every phase listed; the critical path adds up to the total, each phase's share of
        # it no more than its own seconds
        assert list(phases) == list(PHASES), name
        assert sum(path.values()) == pytest.approx(phases["total"], abs=0.05), (name, path)
        assert all(v <= phases[k] + 0.01 for k, v in path.items() if k != "other"), name
        assert phases["read"] > 0 and phases["compile_cache"] > 0 and phases["readahead"] > 0
        assert "(the critical path)" in row["ready_line"]
        # two jobs, each its own output, and the process stopped what it started
        assert row["first_job_segments"] == row["second_job_segments"] > 0
        assert row["first_job_stages"]["denoise_s"] > 0 and row["second_job_s"] > 0
        assert row["threads_left"] == [], row["threads_left"]
        assert any("model cache" in line for line in row["log_tail"])
    outputs = [p for p in folder.parent.iterdir() if p.name.startswith("outputs-")]
    assert len(outputs) == 4
    assert all(len(list(p.glob("default/*/manifest.json"))) == 1 for p in outputs)
    # the targets, each with its figures; on the CPU no decoder graph: no figure
    targets = doc["targets"]
    assert targets["graphs_from_artifact_le_4s"]["met"] is None
    assert {"ready_artifact_warm_le_15s", "first_job_within_10pct_of_second",
            "weights_warm_le_diffusers"} <= set(targets)
    table = (tmp_path / "out" / "worker-start-tiny.md").read_text()
    assert "| no artifact (page cache warm" in table and "framefleet compile: `" in table
    assert "Raw read: 9 files" in table and "## Load methods" in table
