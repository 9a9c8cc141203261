"""The examples run as documented (the ones that need no server)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> str:
    out = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin",
                                           "FRAMEFLEET_METRICS_PORT": "0"})
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_stream_decode_then_read_manifest(tmp_path: Path) -> None:
    np.save(tmp_path / "clip.npy", np.random.default_rng(0).standard_normal((16, 5, 8, 8),
                                                                              dtype=np.float32))
    out = _run("examples/stream_decode.py", str(tmp_path / "clip.npy"), str(tmp_path / "out"),
               "--decoder", "pattern")
    assert "17 frames 64x64" in out
    manifest = (tmp_path / "out" / "local" / "clip" / "manifest.json").as_uri()
    checked = _run("examples/read_manifest.py", manifest, "--pattern")
    assert "clip: 17 frames, 1 segments, ok" in checked


def test_wan_tiny_example(tmp_path: Path) -> None:
    np.save(tmp_path / "w.npy", np.zeros((16, 2, 4, 4), np.float32))
    out = _run("examples/stream_decode.py", str(tmp_path / "w.npy"), str(tmp_path / "o"),
               "--preset", "tiny", "--weights", "random")
    assert "5 frames 32x32" in out
    assert "random weights: the frames are noise" in out
