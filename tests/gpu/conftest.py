"""The GPU suite's own configuration (loaded on its own with ``--confcutdir=tests/gpu``)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist registers it when installed; without it (CI) --strict-markers needs this.
    config.addinivalue_line(
        "markers", "xdist_group(name): tests that share compiled graphs run in one process")
