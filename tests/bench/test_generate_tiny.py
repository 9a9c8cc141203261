"""bench/generate.py --tiny runs on the CPU (the 1.3B and TI2V-5B layouts in miniature):
latents equal diffusers', JSON and table written."""

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
    assert [(r["model"], r["steps"]) for r in doc["runs"]] == [("tiny", 2), ("tiny-ti2v", 2)]
    for run in doc["runs"]:
        assert run["latents_identical"] is True
        ff = run["framefleet"]
        assert ff["frames"] == 9 and ff["denoise_s"] > 0 and ff["wall_s"] >= ff["denoise_s"]
        stages = [s["stage"] for s in ff["cost_stages"]]
        assert stages == ["text_encode", "denoise", "decode", "s3"]
        assert run["diffusers"]["wall_s"] > 0 and run["speedup"] > 0
    assert "| tiny | 48x32x9 | 2 |" in done.stdout
    assert "| tiny-ti2v | 64x64x9 | 2 |" in done.stdout
