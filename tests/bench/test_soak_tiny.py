"""bench/soak/soak.py --tiny runs on the CPU, the GPU soak's code paths at tiny size: a real Redis,
the real worker process (``bench.soak.soak_worker``) with the device call's options, started
compiled from the compile artifacts ``soak_prime.py --artifacts`` wrote (``STAGE=prime``, then
``STAGE=soak`` with ``SOAK_WARM=all``: on the CPU one size compiles, with inductor's C++
backend), one round of the mix (prompt jobs at every tier, the fp8 ones refused by the CPU
worker, image-to-video, two LoRAs, decode-only jobs behind a denoise, a cancel, a hostile
folder, a job over the memory limit), every output checked, the report written."""

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
#: latter names a folder of no libraries here; --artifacts: STAGE=prime's).
DEVICE_OPTIONS = ["--minutes", "0", "--max-minutes", "6", "--jobs", "14", "--warm-sizes", "all",
                  "--budget-s", "780"]


@pytest.mark.timeout(1200)
def test_bench_soak_tiny_starts_compiled_from_artifacts(tmp_path: Path) -> None:
    redis_server = require_binary("redis-server", "redis-server")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "FRAMEFLEET_COMPILE_CACHE_DIR": str(tmp_path / "prime-cache")}
    artifacts = tmp_path / "artifacts"
    primed = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "soak" / "soak_prime.py"), "--tiny", "--soak",
         "--artifacts", str(artifacts), "--out", str(tmp_path / "prime")],
        env=env, capture_output=True, text=True, timeout=400, check=False, cwd=ROOT)
    assert primed.returncode == 0, primed.stdout[-3000:] + primed.stderr[-3000:]
    assert [p.name for p in artifacts.iterdir()] == ["task-0"]
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "soak" / "soak.py"), "--tiny", *DEVICE_OPTIONS,
         "--artifacts", str(artifacts), "--redis-server", redis_server, "--redis-lib",
         str(tmp_path), "--json", "soak.json", "--out", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=840, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    doc = json.loads((tmp_path / "soak.json").read_text())
    assert doc["passed"] and doc["worker_alive_at_end"] and doc["jobs"] >= 14
    assert not doc["not_as_planned"] and not doc["nonfinite_or_bad_output_reported_as_success"]
    kinds = {r["kind"]: r["end"] for r in doc["records"]}
    assert kinds["cancel"] == "cancelled" and kinds["memory"] == "failure:FatalJobError"
    assert kinds["hostile"].startswith("failure:") and kinds["decode"] == "success"
    assert doc["warm_sizes"] == "all"
    # the worker started from the artifact, its compile cache empty: its one compiled size
    # was served by the artifact (an FX graph cache hit), nothing compiled from scratch
    assert doc["artifacts"] == str(artifacts)
    assert [(c["model"], c["tier"], c["what"], c["result"]) for c in doc["compiled"]] == [
        ("tiny-ti2v", "exact", "64x64x9", "hit")], doc["compiled"]
    # the GPU plan's tiers: the fp8 job went to the worker, which refused it (and lived on)
    fp8 = [r for r in doc["records"] if "-fp8" in r["job"]]
    assert fp8 and all(r["end"] == "failure:InvalidJobError" for r in fp8)
    assert all(r["output_ok"] for r in doc["records"] if r["end"] == "success")
    assert (tmp_path / "soak.md").exists()
