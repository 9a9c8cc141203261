"""bench/startup/worker_start.py --tiny runs on the CPU: the published TI2V-5B layout in miniature
is written (sharded float32 transformer with its index, bfloat16 text encoder in 3 shards),
loaded by diffusers and by the worker's start path to ready and a first job; JSON and table
written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_worker_start_tiny(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    folder = tmp_path / "model" / "wan22-ti2v-5b"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "startup" / "worker_start.py"), "--tiny", "--folder",
         str(folder), "--out", str(tmp_path / "out")],
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
    assert 0 < ff["ready_s"] < ff["first_job_end_s"]
    assert "| warm |" in (tmp_path / "out" / "worker-start-tiny.md").read_text()
