"""The CLI tests' settings: the test Redis as the broker."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from producer.settings import get_settings


@pytest.fixture
def env(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The CLI's settings point at the test Redis, flushed before the test and after it."""
    redis.Redis.from_url(redis_url).flushdb()
    monkeypatch.setenv("FRAMEFLEET_BROKER_URL", redis_url)
    monkeypatch.delenv("FRAMEFLEET_RESULT_BACKEND", raising=False)
    get_settings.cache_clear()
    yield redis_url
    get_settings.cache_clear()
    redis.Redis.from_url(redis_url).flushdb()
