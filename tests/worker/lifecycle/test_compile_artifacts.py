"""Compile artifacts through real worker pool processes (Celery prefork children), on the CPU:
inductor's C++ backend compiles the tiny model as it compiles the big ones on a GPU.

One test, in the order a fleet lives it: ``framefleet compile`` (as the README runs it)
compiles cold in its own process (the plain-process yardstick); a first worker, with empty
compile caches and no artifact, compiles in its pool process (no slower than the plain
process), misses with the reason "no artifact" and publishes its artifact; a second worker on
a fresh machine (empty caches) loads it and compiles no graph (inductor's FX graph cache hit,
no miss: its counters); a third, whose artifact says another torch version, refuses it with
that reason and compiles.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.services.base import REPO_ROOT
from tests.services.celery_worker import WorkerProcess
from tests.worker.generate.tiny import save_tiny_model

SIZE = "32x48x9"  # the tiny model's smallest size: inductor on two loaded cores is slow


def _worker(tmp_path: Path, name: str, env: dict[str, str], timeout: float = 400) -> Any:
    """Start a worker, wait for its pool process's ready line, stop it; its warm-up model's
    state (per tier) and its ready line."""
    worker = WorkerProcess(name, tmp_path / "workers", env)
    worker.start()
    try:
        worker._wait_until(lambda: "framefleet worker process ready" in worker.log_text(),
                           timeout, "the pool process's ready line", 0.5)
    finally:
        worker.terminate()
        worker.stop()
    line = next(x for x in worker.log_text().splitlines()
                if "framefleet worker process ready" in x)
    states = [json.loads(p.read_text()) for p in
              (Path(env["FRAMEFLEET_WORK_DIR"]) / "framefleet-ready").glob("*.json")]
    assert len(states) == 1, worker.log_text()[-3000:]
    return states[0]["model"], line


def _env(base: dict[str, str], tmp_path: Path, name: str, model: Path,
         artifacts: Path) -> dict[str, str]:
    work = tmp_path / name
    work.mkdir()
    return {**base, "FRAMEFLEET_DEVICE": "cpu", "FRAMEFLEET_COMPILE_ON_CPU": "1",
            "FRAMEFLEET_WARMUP_MODEL": str(model), "FRAMEFLEET_WARMUP_GENERATE_SIZES": SIZE,
            "FRAMEFLEET_COMPILE_CACHE_DIR": str(work / "compile-cache"),  # a fresh machine
            "FRAMEFLEET_COMPILE_ARTIFACTS": str(artifacts), "FRAMEFLEET_PUBLISH_COMPILED": "1",
            "FRAMEFLEET_WORK_DIR": str(work), "FRAMEFLEET_POOL_START_TIMEOUT_S": "600"}


def _plain_compile(model: Path, out: Path, cache: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "FRAMEFLEET_DEVICE": "cpu",
           "FRAMEFLEET_COMPILE_CACHE_DIR": str(cache)}
    done = subprocess.run([sys.executable, "-m", "producer.cli", "compile", "--model", str(model),
                           "--sizes", SIZE, "--out", str(out)], env=env, text=True,
                          capture_output=True, timeout=400, check=False, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    # on the CPU the decoder has no graphs to compile (they are CUDA graphs)
    seconds = re.search(rf"compiled {SIZE} ([0-9.]+) s; decoder graphs none \(CUDA only\); "
                        "wrote ", done.stdout)
    assert seconds, done.stdout
    return float(seconds[1])


@pytest.mark.timeout(1500)
def test_an_artifact_compiled_in_a_pool_process_makes_the_next_worker_start_warm(
        tmp_path: Path, worker_env: dict[str, str]) -> None:
    model = save_tiny_model(tmp_path / "tiny")
    shared = tmp_path / "artifacts"  # the fleet's FRAMEFLEET_COMPILE_ARTIFACTS
    # Given the compile's time in a plain process (framefleet compile, its own empty caches)
    plain_s = _plain_compile(model, tmp_path / "plain-out", tmp_path / "plain-cache")

    # When a first worker starts with empty caches and no artifact
    first, line = _worker(tmp_path, "w1", _env(worker_env, tmp_path, "w1", model, shared))
    outcome = first["exact"]["cache"][SIZE]
    # Then its pool process compiled (a miss, for want of an artifact), no slower than the
    # plain process (generous: a loaded machine), said so on its ready line, and published
    assert outcome["result"] == "miss" and outcome["fxgraph"]["miss"] >= 1, first
    assert outcome["reason"].startswith("no artifact"), outcome
    assert f"compiled: exact {SIZE} miss (no artifact" in line, line
    pool_s = first["exact"]["sizes"][SIZE]
    assert pool_s <= 2.0 * plain_s + 15, (pool_s, plain_s)
    index = json.loads((shared / "index.json").read_text())
    assert [a["sizes"] for a in index["artifacts"]] == [[SIZE]]
    assert first["exact"]["artifact"]["published"].endswith(index["artifacts"][0]["file"])

    # When a second worker starts on a fresh machine (empty caches) with that artifact
    second, line = _worker(tmp_path, "w2", _env(worker_env, tmp_path, "w2", model, shared))
    outcome = second["exact"]["cache"][SIZE]
    # Then nothing was compiled: inductor's FX graph cache answered, no miss
    assert outcome == {"result": "hit", "reason": "",
                       "fxgraph": {"hit": outcome["fxgraph"]["hit"], "miss": 0}}, outcome
    assert outcome["fxgraph"]["hit"] >= 1
    assert second["exact"]["artifact"]["loaded"].endswith(index["artifacts"][0]["file"])
    assert "published" not in second["exact"]["artifact"]  # nothing new to publish
    assert f"compiled: exact {SIZE} hit" in line, line
    # (Its seconds prove nothing on the CPU: the artifact carries the C++ kernels' source,
    # not their shared objects, so a hit still runs the C++ compiler; Triton's kernels on a
    # GPU travel compiled. The counters are the proof.)
    print(f"plain process {plain_s:.1f} s, pool process cold {pool_s:.1f} s, from the "
          f"artifact {second['exact']['sizes'][SIZE]:.1f} s "
          f"(load {second['exact']['artifact']['load_s']:.2f} s)")

    # When the artifact says another torch version (a worker of a new release)
    index["artifacts"][0]["torch"] = "2.0.0"
    (shared / "index.json").write_text(json.dumps(index))
    third, line = _worker(tmp_path, "w3", _env(worker_env, tmp_path, "w3", model, shared))
    outcome = third["exact"]["cache"][SIZE]
    # Then it is refused with that reason, never loaded, and the size compiles
    assert outcome["result"] == "miss" and outcome["fxgraph"]["miss"] >= 1, outcome
    assert outcome["reason"].startswith("torch 2.0.0 in the artifact"), outcome
    assert "loaded" in third["exact"]["artifact"] and not third["exact"]["artifact"]["loaded"]
