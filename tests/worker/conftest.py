"""Fixtures of the worker tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.services import free_port
from worker import metrics


@pytest.fixture
def metrics_port() -> Iterator[int]:
    port = metrics.start_metrics_server(free_port(), addr="127.0.0.1")
    try:
        yield port
    finally:
        metrics.stop_metrics_server()
