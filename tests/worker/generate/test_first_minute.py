"""The first minute without real weights: ``framefleet models tiny`` writes each layout,
``framefleet demo --generate`` (and ``--image``) runs a prompt (image) job on the embedded
default from an empty folder, saying the weights are random."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from worker.generate.request.folder import read_model

ROOT = Path(__file__).resolve().parents[3]


def _cli(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRAMEFLEET_")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "producer.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.parametrize(("layout", "pipeline", "image_input"), [
    ("t2v", "WanPipeline", "none"), ("ti2v", "WanPipeline", "first_frame"),
    ("i2v", "WanImageToVideoPipeline", "channels"),
])
def test_models_tiny_writes_each_layout(tmp_path: Path, layout: str, pipeline: str,
                                        image_input: str) -> None:
    done = _cli("models", "tiny", "m", "--layout", layout, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "random weights" in done.stdout
    info = read_model(tmp_path / "m")
    assert (info.pipeline, info.image_input) == (pipeline, image_input)
    assert info.random_weights  # the marker: every job on it says its weights are random
    # the tokenizer was made locally (no download): its vocabulary is the tiny one
    vocab = json.loads((tmp_path / "m" / "tokenizer" / "tokenizer.json").read_text())
    assert len(vocab["model"]["vocab"]) <= 128
    again = _cli("models", "tiny", "m", cwd=tmp_path)
    assert again.returncode == 1 and "exists and is not empty" in again.stderr


def test_demo_generate_and_image_from_an_empty_folder(tmp_path: Path) -> None:
    from PIL import Image

    Image.new("RGB", (120, 80), (30, 120, 200)).save(tmp_path / "photo.jpg")
    for args in (["--generate"], ["--generate", "--image", "photo.jpg"]):
        done = _cli("demo", *args, cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "tiny random Wan pipeline (random weights): the video is noise" in done.stdout
        assert "SUCCESS" in done.stdout and "demo: 33 frames" in done.stdout
        assert ("image " in done.stdout) == ("--image" in args)
    assert len(list((tmp_path / "demo-out" / "videos").rglob("manifest.json"))) == 2
    bad = _cli("demo", "--image", "photo.jpg", cwd=tmp_path)
    assert bad.returncode == 1 and "--image: only with --generate" in bad.stderr
