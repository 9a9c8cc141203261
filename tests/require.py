"""Find a real external tool for a test, or skip (fail on CI).

A laptop without chromium still runs the rest of the suite; CI (``CI=true``) installs
everything, so there a missing tool is a failure, not a silent skip (Dramatiq's
``check_redis`` pattern).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest


def on_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def missing(what: str, install: str) -> None:
    """Skip the calling test, or fail it on CI, naming what to install."""
    message = f"{what} not found: install {install}"
    if on_ci():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def require_binary(name: str, install: str) -> str:
    """Return the path of executable ``name`` (the venv's bin first), or skip/fail."""
    venv_bin = Path(sys.executable).parent
    found = shutil.which(name, path=f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}")
    if found is None:
        missing(f"executable {name!r}", install)
    assert found is not None
    return found
