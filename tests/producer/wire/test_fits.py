"""A generate request that does not fit its model or the fleet's limits is refused at submit,
naming every field at fault (``producer.wire.fits``), where the submitting host reads the
model's folder: ``Client.submit`` and ``framefleet submit``, on a real Redis, claim and queue
nothing. The gateway makes the same check (tests/producer/api/test_fits.py), the worker too on
receipt (tests/worker/generate/test_generate_job.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from producer.app import QUEUE
from producer.client import Client
from producer.errors import InvalidJobError
from producer.settings import Settings
from producer.state import keys
from producer.wire.fits import GENERATE, Limits, faults, multiples, read_reach
from producer.wire.reach import reach
from producer.wire.rules import LocalPathWarning
from producer.wire.spec import parse_spec
from tests.services import REPO_ROOT

#: What Wan2.2 TI2V-5B's configs say of its sizes (its VAE compresses 16x): multiples of 32.
TI2V: dict[str, dict[str, Any]] = {
    "transformer/config.json": {"patch_size": [1, 2, 2], "rope_max_seq_len": 1024,
                                "in_channels": 48, "out_channels": 48},
    "vae/config.json": {"scale_factor_spatial": 16, "scale_factor_temporal": 4}}
LIMITS = Limits(steps=100, frames=4000, pixels=1920 * 1088)


def _model(folder: Path, configs: dict[str, dict[str, Any]] = TI2V) -> Path:
    """A model folder as far as a submitting host reads one: its two configs."""
    for name, config in {"model_index.json": {"_class_name": "WanPipeline"}, **configs}.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(json.dumps(config))
    return folder


def test_every_field_at_fault_is_named() -> None:
    model = reach(*TI2V.values())
    assert multiples(model) == (32, 32)
    # 40x40 for a model of 32: the width and the height; 400 steps over the fleet's 100
    found = faults(40, 40, 81, 400, model, LIMITS)
    assert [f.split(":")[0] for f in found] == [GENERATE.steps, GENERATE.width, GENERATE.height]
    assert found[0] == ("generate.num_inference_steps: 400 exceeds the limit of 100 "
                        "(FRAMEFLEET_MAX_DENOISE_STEPS)")
    assert found[1].startswith("generate.width: 40 is not a multiple of 32 (the VAE's 16")
    assert found[2].startswith("generate.height: 40 is not a multiple of 32")
    # one axis at fault: only that one
    assert [f.split(":")[0] for f in faults(64, 40, 81, 50, model, LIMITS)] == [GENERATE.height]
    assert faults(64, 32, 81, 100, model, LIMITS) == []


def test_frames_and_pixels_and_reach() -> None:
    # A VAE that compresses time 8x takes 8k+1 frames; frames over the fleet's limit
    eight = reach(TI2V["transformer/config.json"],
                  {"scale_factor_spatial": 16, "scale_factor_temporal": 8})
    assert faults(64, 32, 13, 10, eight, LIMITS) == [
        "generate.num_frames: must be 8k+1 for this model, got 13"]
    assert faults(64, 32, 4001, 10, None, LIMITS) == [
        "generate.num_frames: 4001 exceeds the limit of 4000 (FRAMEFLEET_MAX_FRAMES)"]
    # Pixels: the fleet's limit, named once for both sides
    assert faults(4096, 4096, 9, 10, None, LIMITS) == [
        "generate.height, generate.width: 4096x4096 exceeds the limit of 2088960 pixels "
        "(FRAMEFLEET_MAX_PIXELS)"]
    # A model whose positions reach 512 px and 125 frames (the tiny one)
    tiny = reach({"rope_max_seq_len": 32}, {})
    assert [f.split(":")[0] for f in faults(528, 64, 129, 10, tiny, LIMITS)] == [
        GENERATE.frames, GENERATE.width]
    # Without the model's folder only the fleet's limits apply
    assert faults(40, 40, 81, 50, None, LIMITS) == []


def test_the_configs_are_read_bounded_or_not_at_all(tmp_path: Path) -> None:
    assert read_reach(_model(tmp_path / "ti2v")) == reach(*TI2V.values())
    assert read_reach(tmp_path / "nowhere") is None
    bad = _model(tmp_path / "bad", {**TI2V, "vae/config.json": {"scale_factor_spatial": 0}})
    assert read_reach(bad) is None  # the worker names what is wrong with it
    (tmp_path / "big" / "transformer").mkdir(parents=True)
    (tmp_path / "big" / "transformer" / "config.json").write_text(" " * (2 * 1024**2))
    assert read_reach(tmp_path / "big") is None


def _spec(model: Path, **generate: Any) -> Any:
    return parse_spec({"job_id": "fits-1", "output": {"uri": "s3://b/out"}, "generate": {
        "model": model.as_uri(), "prompt": "a fox", "num_frames": 9, **generate}})


def test_client_submit_refuses_before_anything_is_queued(tmp_path: Path,
                                                        redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    model = _model(tmp_path / "models" / "ti2v")
    client = Client(settings=Settings(broker_url=redis_url, file_roots=str(tmp_path)))
    # When a request that fits neither the model nor the fleet's step limit is submitted
    with pytest.raises(InvalidJobError) as e:
        client.submit(_spec(model, width=40, height=40, num_inference_steps=400))
    # Then every field at fault is named, and nothing is claimed or queued
    assert [part.split(":")[0] for part in str(e.value).split("; ")] == [
        "generate.num_inference_steps", "generate.width", "generate.height"]
    assert not r.exists(keys.claim("fits-1")) and r.llen(QUEUE) == 0
    # A host that cannot see the folder (no roots here) leaves it to the workers
    elsewhere = Client(settings=Settings(broker_url=redis_url))
    with pytest.warns(LocalPathWarning):
        handle = elsewhere.submit(_spec(model, width=40, height=40, num_inference_steps=400))
    assert handle.state().state == "QUEUED"
    r.delete(QUEUE, keys.claim("fits-1"), keys.spec_doc("fits-1"))


def test_framefleet_submit_names_each_flag(tmp_path: Path, redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    _model(tmp_path / "models" / "ti2v")
    base = {k: v for k, v in os.environ.items() if not k.startswith("FRAMEFLEET_")}
    env = {**base, "PYTHONPATH": str(REPO_ROOT), "COLUMNS": "200",
           "FRAMEFLEET_BROKER_URL": redis_url, "FRAMEFLEET_FILE_ROOTS": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "producer.cli", "submit", "--prompt", "a fox",
                          "--model", "models/ti2v", "--size", "40x40", "--frames", "9",
                          "--steps", "400", "--output", "out", "--job-id", "fits-cli"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --steps: 400 exceeds the limit of "
                                                   "100 (FRAMEFLEET_MAX_DENOISE_STEPS); "), lines
    assert "--size (width): 40 is not a multiple of 32" in lines[0], lines
    assert "--size (height): 40 is not a multiple of 32" in lines[0], lines
    assert "~" not in out.stderr  # no estimate of a job that never runs
    assert not r.exists(keys.claim("fits-cli")) and r.llen(QUEUE) == 0
