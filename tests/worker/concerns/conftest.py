"""Fixtures of the concern tests: an app on the session's Redis, a tenant of the test's own."""

from __future__ import annotations

import secrets

import pytest
from celery import Celery

from producer.app import make_app


@pytest.fixture
def app(redis_url: str) -> Celery:
    return make_app(redis_url, redis_url)


@pytest.fixture
def tenant(monkeypatch: pytest.MonkeyPatch) -> str:
    """A tenant of its own, so the counters a test reads are its own (allowed in the metrics'
    tenant label: the Settings a test builds read it)."""
    name = f"t-{secrets.token_hex(4)}"
    monkeypatch.setenv("FRAMEFLEET_METRICS_TENANTS", name)
    return name
