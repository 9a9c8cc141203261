"""bench/generate.py --tiny runs on the CPU: latents equal diffusers', JSON and table written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_generate_tiny(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "generate.py"), "--tiny", "--out", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads((tmp_path / "generate.json").read_text())
    (run,) = doc["runs"]
    assert run["model"] == "tiny" and run["steps"] == 2 and run["latents_identical"] is True
    ff = run["framefleet"]
    assert ff["frames"] == 9 and ff["denoise_s"] > 0 and ff["wall_s"] >= ff["denoise_s"]
    assert [s["stage"] for s in ff["cost_stages"]] == ["text_encode", "denoise", "decode", "s3"]
    assert run["diffusers"]["wall_s"] > 0
    assert "| tiny | 48x32x9 | 2 |" in done.stdout
