"""Fixtures of the deployment tests."""

from __future__ import annotations

from typing import Any

import pytest

from tests.infra.k8s_render import OVERLAYS, render


@pytest.fixture(params=OVERLAYS)
def objects(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    """Every object one overlay of infra/k8s renders to (each overlay in turn)."""
    return render(request.param)
