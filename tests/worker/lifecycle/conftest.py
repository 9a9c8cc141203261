"""Fixtures of the lifecycle tests that talk to the test Redis (recovery, reconcile)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from celery import Celery

from producer.app import make_app


@pytest.fixture
def app(redis_url: str, request: pytest.FixtureRequest) -> Iterator[Celery]:
    """A Celery app on the test Redis, flushed, with the test module's ``SETTINGS``."""
    redis.Redis.from_url(redis_url).flushdb()
    app = make_app(redis_url, redis_url, request.module.SETTINGS)
    yield app
    app.close()


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()
