"""The package as pip builds and installs it: a wheel of a copy of the sources (the checkout
gets no build folder), and a fresh install of it into a folder of its own."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.services import REPO_ROOT

#: What the build reads (the Dockerfiles' allow-list says the same).
SOURCES = ("pyproject.toml", "README.md", "producer", "worker")


def build_wheel(tmp: Path) -> tuple[Path, str]:
    """``pip wheel`` of the sources, offline (this venv's setuptools); returns the wheel and
    pip's verbose output (the build backend's warnings are in it)."""
    src = tmp / "src"
    for name in SOURCES:
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, src / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            src.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, src / name)
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v",
         "-w", str(tmp / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (wheel,) = (tmp / "dist").glob("framefleet-*.whl")
    return wheel, out.stdout + out.stderr


def install_fresh(wheel: Path, target: Path) -> Path:
    """``pip install`` of the wheel into ``target`` alone (its dependencies are this venv's:
    put ``target`` first on ``PYTHONPATH``, and run from elsewhere than the checkout)."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target",
         str(target), str(wheel)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return target
