"""A fleet for the webhook tests: a client and real workers that share one allow-list."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from producer.client import Client
from producer.settings import get_settings

SECRET = "fleet-webhook-secret-e2e"
TIMEOUT_S = 8.0  # one delivery attempt to a receiver that does not answer
Fleet = Callable[..., Client]


def webhook_env(*ports: int, timeout_s: float = TIMEOUT_S) -> dict[str, str]:
    """The fleet's webhook settings: http to loopback, on ``ports`` under ``/hook`` only."""
    return {
        "FRAMEFLEET_WEBHOOK_SECRET": SECRET,
        "FRAMEFLEET_WEBHOOK_SCHEMES": "http",
        "FRAMEFLEET_WEBHOOK_HOSTS": ",".join(f"http://127.0.0.1:{p}/hook" for p in ports),
        "FRAMEFLEET_WEBHOOK_TIMEOUT_S": str(timeout_s),
        "FRAMEFLEET_WEBHOOK_BACKOFF_S": "0.5",
    }


def start_fleet(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, worker_factory: Any
) -> Iterator[Fleet]:
    """The body of a ``fleet`` fixture: yields ``start(*ports, workers=1, **env)``, which sets
    :func:`webhook_env` (plus ``env``) for this process and ``workers`` new workers, and
    returns a client; the environment is restored afterwards."""
    redis.Redis.from_url(redis_url).flushdb()

    def start(*ports: int, workers: int = 1, **env: str) -> Client:
        merged = {**webhook_env(*ports), **env}
        for key, value in merged.items():
            monkeypatch.setenv(key, value)
        get_settings.cache_clear()
        if workers:
            worker_factory(workers, env=merged)
        return Client(broker_url=redis_url, backend_url=redis_url)

    yield start
    monkeypatch.undo()
    get_settings.cache_clear()
