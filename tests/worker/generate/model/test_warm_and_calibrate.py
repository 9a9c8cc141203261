"""The warm-up model per tier before ready, and the MagCache calibration command: diffusers'
calibrate mode gives ratios a job's MagCache then runs with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from producer.settings import Settings
from producer.state.readiness import live_states, state_dir
from producer.wire.spec import JobSpec, OutputSpec, VideoSpec
from tests.worker.generate.tiny import tiny_generate
from worker.lifecycle.warmup import warm_up
from worker.run import Run, default_decoders, run_job

ROOT = Path(__file__).resolve().parents[4]


def test_warm_up_model_per_tier_before_ready(tiny_model: Path, tmp_path: Path) -> None:
    settings = Settings(device="cpu", work_dir=str(tmp_path), warmup_model=str(tiny_model),
                        warmup_tiers="exact,fp8", warmup_generate_sizes="32x48x9")
    decoders = default_decoders(settings)
    state = warm_up(decoders, settings)
    assert state.ready
    # exact: resident (on the CPU nothing compiles); fp8: this CPU cannot, said so, no crash
    assert state.model["exact"]["load_s"] > 0 and state.model["exact"]["sizes"] == {}
    assert "generate.tier: fp8 needs a GPU" in state.model["fp8"]["error"]
    assert [k[2] for k in decoders.models.keys()] == ["exact"]
    (written,) = live_states(state_dir(settings))
    assert written.ready and written.model["exact"]["load_s"] == state.model["exact"]["load_s"]


def test_calibrate_magcache_command_feeds_a_job(tiny_model: Path, tmp_path: Path,
                                                tmp_path_factory: Any) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "FRAMEFLEET_DEVICE": "cpu"}
    done = subprocess.run([sys.executable, "-m", "worker", "calibrate-magcache", "--model",
                           str(tiny_model), "--steps", "6", "--size", "32x48x9"], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    cache = json.loads(done.stdout.strip().splitlines()[-1])
    assert cache["kind"] == "mag" and len(cache["mag_ratios"]) == 6
    assert cache["mag_ratios"][0] == 1.0 and all(r > 0 for r in cache["mag_ratios"])
    settings = Settings(device="cpu", file_roots=str(tmp_path_factory.getbasetemp()))
    spec = JobSpec(job_id="mag", generate=tiny_generate(
        tiny_model, num_inference_steps=6, cache={**cache, "threshold": 0.5,
                                                  "retention_ratio": 0.0}),
        output=OutputSpec(uri=tmp_path.as_uri()), video=VideoSpec(segment_frames=4))
    result = run_job(spec, default_decoders(settings), Run(spec, settings=settings))
    assert result.manifest.generate is not None and result.manifest.generate.cache == "mag"
    params = result.manifest.generate.cache_params
    assert params is not None and params["mag_ratios"] == cache["mag_ratios"]
