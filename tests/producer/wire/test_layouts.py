"""A LoRA made for another layout is refused at submit, naming both, where the submitting
host sees the model folder and the LoRA (``producer.wire.layouts``, ``check_local_files``);
the worker keeps the same rule for what it loads. Through ``framefleet submit`` and a real
Redis: nothing is claimed or queued."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import redis
from safetensors.numpy import save_file

from producer.state import keys
from producer.wire import layouts
from tests.services import REPO_ROOT
from worker.generate.model.tiny import write_tiny


def _lora(path: Path, made_for: str | None) -> Path:
    save_file({"w.lora_A.weight": np.zeros((2, 4), np.float32)}, str(path),
              metadata={layouts.LORA_MADE_FOR: made_for} if made_for else None)
    return path


@pytest.mark.parametrize(("config", "layout"), [
    ({"in_channels": 16, "out_channels": 16}, "t2v"),
    ({}, "t2v"),  # diffusers' defaults
    ({"in_channels": 36, "out_channels": 16}, "i2v"),
    ({"in_channels": 48, "out_channels": 48}, "ti2v"),
])
def test_a_models_layout_is_read_from_its_transformer_config(config: dict[str, int],
                                                             layout: str) -> None:
    assert layouts.layout(config) == layout


def test_a_loras_layout_is_read_from_its_header_only(tmp_path: Path) -> None:
    assert layouts.read_made_for(_lora(tmp_path / "a.safetensors", "ti2v")) == "ti2v"
    assert layouts.read_made_for(_lora(tmp_path / "b.safetensors", None)) is None
    # A header that claims to be huge is not read (a few KB is what a LoRA's takes)
    huge = tmp_path / "huge.safetensors"
    huge.write_bytes((2**40).to_bytes(8, "little") + b"{}")
    assert layouts.read_made_for(huge) is None
    (tmp_path / "short.safetensors").write_bytes(b"\x05")
    assert layouts.read_made_for(tmp_path / "short.safetensors") is None
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes((4).to_bytes(8, "little") + b"{{{{")
    assert layouts.read_made_for(garbage) is None
    deep = b"[" * 100_000  # nesting deeper than the JSON parser goes
    garbage.write_bytes(len(deep).to_bytes(8, "little") + deep)
    assert layouts.read_made_for(garbage) is None


def _submit(cwd: Path, redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("FRAMEFLEET_")}
    env = {**base, "PYTHONPATH": str(REPO_ROOT), "COLUMNS": "200",
           "FRAMEFLEET_BROKER_URL": redis_url, "FRAMEFLEET_FILE_ROOTS": str(cwd)}
    return subprocess.run([sys.executable, "-m", "producer.cli", "submit", "--prompt", "a fox",
                           "--model", "models/t2v", "--size", "64x64", "--frames", "9",
                           "--steps", "2", "--output", "out", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_submit_refuses_a_lora_made_for_another_layout_naming_both(tmp_path: Path,
                                                                    redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    # Given a t2v model and a LoRA written for a ti2v model (its widths fit the t2v one)
    write_tiny(tmp_path / "models" / "t2v", "t2v", lora=tmp_path / "own.safetensors")
    write_tiny(tmp_path / "models" / "ti2v", "ti2v", lora=tmp_path / "ti2v.safetensors")
    # When it is submitted with the t2v model
    out = _submit(tmp_path, redis_url, "--lora", "ti2v.safetensors:0.8", "--job-id", "wrong-1")
    # Then it is refused at once, one line naming the flag and both layouts, nothing queued
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stderr.startswith(
        f"error: --lora #1: {(tmp_path / 'ti2v.safetensors').as_uri()} is a LoRA "
        "made for a ti2v model; this model is t2v"), out.stderr
    assert not r.exists(keys.claim("wrong-1"))
    # while the model's own LoRA, and a LoRA that says nothing of its layout, are queued
    _lora(tmp_path / "plain.safetensors", None)
    for i, lora in enumerate(("own.safetensors", "plain.safetensors")):
        ok = _submit(tmp_path, redis_url, "--lora", lora, "--job-id", f"right-{i}")
        assert ok.returncode == 0 and ok.stdout.strip() == f"right-{i}", ok.stdout + ok.stderr
