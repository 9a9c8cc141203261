"""The tiny random Wan pipeline, saved once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.generate.tiny import save_tiny_model


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("models") / "tiny-wan")
