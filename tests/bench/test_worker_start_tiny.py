"""bench/startup/worker_start.py --tiny runs on the CPU: the published TI2V-5B layout in miniature
is written (sharded float32 transformer with its index, bfloat16 text encoder in 3 shards),
loaded by diffusers and by the worker's start path to ready and a first job, whose process
then exits 0 with nothing left running (on the H200 it died at exit); each load method
compared, with a digest of every tensor against diffusers'; JSON and tables written. With the
device call's options."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


#: The device call's options (bench/results: ``worker_start.py --folder DIR --methods
#: diffusers,fast:16 --threads-list 16``).
DEVICE_OPTIONS = ["--methods", "diffusers,fast:16", "--threads-list", "16"]


def test_bench_worker_start_tiny(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    folder = tmp_path / "model" / "wan22-ti2v-5b"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "startup" / "worker_start.py"), "--tiny", "--folder",
         str(folder), "--out", str(tmp_path / "out"), *DEVICE_OPTIONS],
        env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    shards = sorted(p.name for p in (folder / "transformer").glob("*.safetensors"))
    assert len(shards) == 5 and (folder / "text_encoder" / "model.safetensors.index.json").exists()
    doc = json.loads((tmp_path / "out" / "worker-start-tiny.json").read_text())
    assert {"command", "date", "device", "bytes", "dropped_caches", "runs"} <= set(doc)
    (run,) = doc["runs"]
    assert run["cache"] == "warm" and run["diffusers"]["weights_to_device_s"] > 0
    ff = run["framefleet"]
    assert {"imports", "read", "cast_move", "compile_cache", "warmup", "total"} <= set(
        ff["phases"])
    assert 0 < ff["ready_s"] < ff["first_job_end_s"] and ff["first_job_segments"] > 0
    assert ff["first_job_stages"]["denoise_s"] > 0
    assert any("model cache" in line for line in ff["log_tail"])
    # its process stopped what it started and exited 0 by itself, nothing left running
    # (run_child fails the run on another exit status or on "terminate called")
    assert ff["threads_left"] == [], ff["threads_left"]
    # a row per load method; each that ran has a digest, and the fast path's is diffusers'
    rows = {r["method"]: r for r in doc["load_methods"]["rows"]}
    assert list(rows) == ["diffusers", "fast:16"]
    assert rows["diffusers"] == run["diffusers"]  # the start rows' baseline is that row
    for row in rows.values():
        assert row["status"] == "ok", row
        assert len(row["digest"]) == 64 and row["exact"] is True
        assert row["seconds"] > 0 and row["rss_peak_bytes"] > 0 and row["on_device"]
    chosen = doc["load_methods"]["chosen"]
    assert rows[chosen["method"]]["exact"] and chosen["cache"] == "warm"
    table = (tmp_path / "out" / "worker-start-tiny.md").read_text()
    assert "| warm |" in table and "## Load methods" in table
    assert f"chosen: {chosen['method']} (" in table


def test_every_start_row_runs_its_own_first_job(tmp_path: Path) -> None:
    """A second start on the same folder (the H200 run's page-cache-dropped row) generates its
    first job again: it used to find the first row's output and return it in 2 ms."""
    sys.path.insert(0, str(ROOT))
    from bench.startup import worker_start

    folder = tmp_path / "model" / "wan22-ti2v-5b"
    worker_start.write_folder(folder, "tiny-ti2v", "cpu")
    first, second = (worker_start.run_child(folder, "cpu", True, 1) for _ in range(2))
    assert first["first_job_segments"] == second["first_job_segments"] > 0
    outputs = sorted(p for p in folder.parent.iterdir() if p.name.startswith("outputs-"))
    assert len(outputs) == 2
    assert all((p / "default" / "first" / "manifest.json").exists() for p in outputs)
