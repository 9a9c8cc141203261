"""Every benchmark script still runs: the CPU ones at a smoke size (each checks its own
results before it writes them), the GPU ones as far as ``--help``. Timings are not read here:
they come from the benchmarks' committed results."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU_ONLY = ["decode/decode.py", "decode/decode_fast.py", "generate/generate.py",
            "startup/warm_start.py"]


def _bench(script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run a benchmark script; past ``timeout`` it gets SIGTERM (so it stops what it started)
    and then SIGKILL, and the test fails."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, str(ROOT / "bench" / script), *args]
    with subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                out, err = proc.communicate(timeout=150)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                out, err = proc.communicate()
            pytest.fail(f"{script} ran over {timeout:.0f} s:\n{out[-2000:]}{err[-3000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@pytest.mark.parametrize("script", GPU_ONLY)
def test_gpu_benchmarks_answer_help(script: str) -> None:
    done = _bench(script, "--help", timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage:") and "--out" in done.stdout


def test_pipeline_runs_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "pipeline.json"
    # diffusers' export needs OpenCV or imageio, which the test extra does not install
    done = _bench("decode/pipeline.py", "--device", "cpu", "--jobs", "tiny:64x64x9", "--reps", "1",
                  "--modes", "decode_only,async,sequential", "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(out.read_text())


def test_ttfp_runs_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "ttfp.json"
    done = _bench("decode/ttfp.py", "--device", "cpu", "--decoder", "pattern", "--sizes", "64x64",
                  "--frames", "17", "--reps", "1", "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(out.read_text())


def test_fleet_runs_on_cpu_workers(tmp_path: Path) -> None:
    out = tmp_path / "fleet.json"
    done = _bench("fleet/fleet.py", "--cpu", "1", "--jobs", "2", "--decoder", "pattern", "--size",
                  "64x64", "--frames", "9", "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(out.read_text())


def test_queue_bench_runs_at_a_smoke_size(tmp_path: Path) -> None:
    out = tmp_path / "queue.json"
    done = _bench("fleet/queue_bench.py", "--latency-jobs", "3", "--warmup-jobs", "1",
                  "--long-idle-jobs", "0", "--submit-jobs", "40", "--rounds", "1",
                  "--profile-jobs", "20", "--variant-jobs", "20", "--bulk-jobs", "40",
                  "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(out.read_text())
    assert doc and out.with_suffix(".md").exists()
    assert doc["throughput"]["client_submit_many"]["jobs"] == 40  # the bulk path, timed


#: Options a device call may use that ``--tiny`` stands for in CI (the models and device).
TINY_STANDS_FOR = {"--models", "--device", "--folder"}


def test_every_option_of_the_device_calls_runs_in_ci() -> None:
    """Each ``python3 bench/...`` call of bench/gpu_trust.sh and bench/gpu_startup.sh uses
    only options that a CI test passes to the same script in its ``--tiny`` mode
    (tests/bench/): a device run meets no option whose code path CI never took."""
    import re

    from tests.bench import test_generate_tiny, test_soak_tiny, test_worker_start_tiny

    ci = {
        "generate/generate.py": {*test_generate_tiny.DEVICE_BENCH, "--previews", "--out"},
        "soak/soak.py": {*test_soak_tiny.DEVICE_OPTIONS, "--redis-server", "--redis-lib",
                         "--artifacts", "--out"},
        "soak/soak_prime.py": {"--soak", "--bench", "--artifacts", "--out"},
        "startup/worker_start.py": {*test_worker_start_tiny.DEVICE_OPTIONS, "--out"},
    }
    text = "".join((ROOT / "bench" / name).read_text() for name in (
        "gpu_trust.sh", "gpu_startup.sh")).replace("\\\n", " ")
    calls = re.findall(r"python3 bench/(\S+\.py)([^\n]*)", text)
    assert {script for script, _ in calls} >= {"generate/generate.py", "soak/soak.py",
                                              "soak/soak_prime.py", "startup/worker_start.py"}
    for script, rest in calls:
        used = set(re.findall(r"(?<!\S)--[a-z][a-z-]*", rest)) - TINY_STANDS_FOR
        allowed = {o for o in ci[script] if o.startswith("--")}
        assert used <= allowed, f"{script}: {sorted(used - allowed)} never run in CI"
