"""A submit while Redis goes away, on a real Redis (append-only, so a restart keeps the claim)
that the test stops and starts again; no worker.

- Redis away before the claim: the submit fails at once naming the broker; nothing is claimed.
- Redis away after the claim, back within ``FRAMEFLEET_WAIT_OUTAGE_S``: the submit says it
  waits, then queues the message once Redis answers; it returns as the job is queued.
- Redis away for longer: the error says the job is claimed but not queued, and the same spec
  submitted again once Redis is back queues it (before, the claim stood with no message, and
  every resubmit answered "queued" while nothing was).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import producer.client.client as client_module
from producer.client import Client
from producer.errors import BrokerUnavailable
from producer.settings import Settings
from producer.state import keys
from producer.wire.spec import DecoderSpec, InputSpec, JobSpec, OutputSpec
from tests.producer.client.test_resubmit import _queued
from tests.services import RedisServer, durable_redis

#: Seconds Redis stays away in the case that it comes back.
AWAY_S = 2.0


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    with durable_redis(tmp_path / "redis") as server:
        yield server


def _spec() -> JobSpec:
    return JobSpec(job_id=f"away-{secrets.token_hex(4)}", input=InputSpec(uri="s3://b/in.npy"),
                   decoder=DecoderSpec(name="pattern"),
                   output=OutputSpec(uri="s3://b/out"))


def _client(server: RedisServer, outage_s: float = 60.0) -> Client:
    return Client(settings=Settings(broker_url=server.url, wait_outage_s=outage_s))


def _away_after_the_claim(monkeypatch: pytest.MonkeyPatch, server: RedisServer,
                          back: threading.Event | None) -> None:
    """Stop Redis between the claim and the message, as a failover might; with ``back``,
    start it again ``AWAY_S`` later from a thread that lives until ``back`` is set (a server
    dies with the thread that started it)."""
    send = client_module.send_job

    def send_later() -> None:
        time.sleep(AWAY_S)
        server.start()
        assert back is not None
        back.wait()

    def away(*args: Any, **kwargs: Any) -> None:
        server.stop()
        if back is not None:
            threading.Thread(target=send_later, daemon=True).start()
        send(*args, **kwargs)

    monkeypatch.setattr(client_module, "send_job", away)


def test_a_broker_away_before_the_claim_fails_at_once(own_redis: RedisServer) -> None:
    client, spec = _client(own_redis), _spec()
    own_redis.stop()
    started = time.monotonic()
    with pytest.raises(BrokerUnavailable, match=rf"127\.0\.0\.1:{own_redis.port}.*connection "
                       "refused"):
        client.submit(spec)
    assert time.monotonic() - started < 3
    own_redis.start()
    assert not redis.Redis.from_url(own_redis.url).exists(keys.claim(spec.key))


def test_a_broker_back_within_the_bound_gets_the_message(
        own_redis: RedisServer, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    client, spec = _client(own_redis), _spec()
    back = threading.Event()
    _away_after_the_claim(monkeypatch, own_redis, back)
    try:
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="producer.client.send"):
            handle = client.submit(spec)
        waited = time.monotonic() - started
        # Then it waited for Redis, said so, and queued the job once
        assert AWAY_S <= waited < AWAY_S + 15, waited
        said = [r.getMessage() for r in caplog.records]
        assert len(said) == 2, said
        assert said[0].startswith(f"broker {own_redis.url}: connection refused: job "
                                  f"{spec.key} is claimed, its message not sent yet; waiting "
                                  "up to 60 s"), said
        assert said[1].startswith(f"job {spec.key}: the broker at 127.0.0.1:{own_redis.port} "
                                  "answered again after"), said
        assert _queued(redis.Redis.from_url(own_redis.url), spec.key) == 1
        assert handle.state().state == "QUEUED"
    finally:
        own_redis.stop()
        back.set()


def test_past_the_bound_the_claim_is_kept_and_a_resubmit_queues_it(
        own_redis: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    client, spec = _client(own_redis, outage_s=1.0), _spec()
    _away_after_the_claim(monkeypatch, own_redis, None)
    started = time.monotonic()
    with pytest.raises(BrokerUnavailable) as e:
        client.submit(spec)
    assert 1.0 <= time.monotonic() - started < 12
    assert f"127.0.0.1:{own_redis.port}" in str(e.value)
    assert f"job {spec.key} is claimed but not queued; submit the same spec again" in str(e.value)
    # When Redis is back and the same spec is submitted again
    own_redis.start()
    r = redis.Redis.from_url(own_redis.url)
    assert r.exists(keys.claim(spec.key)) and _queued(r, spec.key) == 0
    monkeypatch.undo()
    handle = client.submit(spec)
    # Then its message is queued, once, however often it is submitted
    client.submit(spec)
    assert _queued(r, spec.key) == 1
    assert handle.state().state == "QUEUED"
