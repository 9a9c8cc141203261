"""Fixtures of the sink tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from worker.sinks.webhooks import Notifier


@pytest.fixture
def notifiers() -> Iterator[list[Notifier]]:
    """The notifiers a test makes (append them), each closed after it."""
    made: list[Notifier] = []
    yield made
    for n in made:
        n.close(timeout=2.0)
