"""The tiny random Wan pipeline, saved once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.worker.generate.tiny import save_tiny_model


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("models") / "tiny-wan")


@pytest.fixture(scope="session")
def wan22_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The Wan2.2 layouts in miniature: TI2V (48 channels, x16 VAE) and two experts (A14B)."""
    root = tmp_path_factory.mktemp("models22")
    return {p: save_tiny_model(root / p, preset=p) for p in ("tiny-ti2v", "tiny-a14b")}
