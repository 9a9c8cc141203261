"""The persistent compile cache serves a restarted worker: the second process that compiles the
worker's decode graph finds both the AOTAutograd and the FX graph entry the first one wrote.

Regression guard: a compiled graph whose inputs are named after something that differs per
process (a module's ``id()`` did, for the sub-pixel kernels) misses the AOTAutograd cache on
every start, which cost ~2.5 s of every warm start on an H200. Inductor's CPU backend, a tiny
model: the cache keys are built the same way as on a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

CHILD = """
import json, sys, torch
from worker.lifecycle.warmup import use_compile_cache
use_compile_cache(sys.argv[1])
from torch._dynamo.utils import counters
from worker.decoders.wan import build_vae
from worker.decoders.wan_graph import ChunkGraphs, steady_caches
vae = build_vae("tiny-wan2.2", seed=0)
graphs = ChunkGraphs.for_vae(vae, torch.device("cpu"), capacity=0)  # the worker's TUNING
key = (1, 48, 2, 3, torch.float32)
caches = steady_caches(graphs.step, key, torch.device("cpu"), graphs.memory_format)
z = torch.zeros((1, 48, 1, 2, 3)).contiguous(memory_format=graphs.memory_format)
with torch.inference_mode():
    graphs._run(z, caches)
print(json.dumps({**counters["aot_autograd"], **counters["inductor"]}))
"""


def _compile_once(cache: Path) -> dict[str, int]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", CHILD, str(cache)], env=env, text=True,
                          capture_output=True, timeout=280, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    counters: dict[str, int] = json.loads(done.stdout.strip().splitlines()[-1])
    return counters


def test_restarted_worker_hits_both_compile_caches(tmp_path: Path) -> None:
    # Given a worker process that compiled its decode graph into an empty cache folder
    first = _compile_once(tmp_path)
    assert first.get("autograd_cache_miss") == 1 and first.get("fxgraph_cache_miss") == 1
    # When a new process (a restarted worker) compiles the same graph with the same folder
    second = _compile_once(tmp_path)
    # Then both cache levels answer: nothing is lowered or compiled again
    assert second.get("autograd_cache_hit") == 1, second
    assert second.get("fxgraph_cache_hit") == 1, second
    assert "autograd_cache_miss" not in second and "fxgraph_cache_miss" not in second
