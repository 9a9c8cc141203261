"""bench/soak/soak.py --tiny runs on the CPU, the GPU soak's code paths at tiny size: a real Redis,
the real worker process (``bench.soak.soak_worker``) with the device call's options, one round of
the mix (prompt jobs at every tier, the fp8 ones refused by the CPU worker, image-to-video, two
LoRAs, decode-only jobs behind a denoise, a cancel, a hostile folder, a job over the memory
limit), every output checked, the report written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.require import require_binary

ROOT = Path(__file__).resolve().parents[2]


#: bench/gpu_trust.sh's STAGE=soak options at tiny size (and --redis-server, --redis-lib: the
#: latter names a folder of no libraries here).
DEVICE_OPTIONS = ["--minutes", "0", "--max-minutes", "6", "--jobs", "14", "--warm-sizes", "none",
                  "--budget-s", "780"]


@pytest.mark.timeout(900)
def test_bench_soak_tiny(tmp_path: Path) -> None:
    redis_server = require_binary("redis-server", "redis-server")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "soak" / "soak.py"), "--tiny", *DEVICE_OPTIONS,
         "--redis-server", redis_server, "--redis-lib", str(tmp_path), "--json", "soak.json",
         "--out", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=840, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    doc = json.loads((tmp_path / "soak.json").read_text())
    assert doc["passed"] and doc["worker_alive_at_end"] and doc["jobs"] >= 14
    assert not doc["not_as_planned"] and not doc["nonfinite_or_bad_output_reported_as_success"]
    kinds = {r["kind"]: r["end"] for r in doc["records"]}
    assert kinds["cancel"] == "cancelled" and kinds["memory"] == "failure:FatalJobError"
    assert kinds["hostile"].startswith("failure:") and kinds["decode"] == "success"
    assert doc["warm_sizes"] == "none"
    # the GPU plan's tiers: the fp8 job went to the worker, which refused it (and lived on)
    fp8 = [r for r in doc["records"] if "-fp8" in r["job"]]
    assert fp8 and all(r["end"] == "failure:InvalidJobError" for r in fp8)
    assert all(r["output_ok"] for r in doc["records"] if r["end"] == "success")
    assert (tmp_path / "soak.md").exists()
