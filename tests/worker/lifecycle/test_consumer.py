"""The consumer's guards against a real Redis: an item that is not a message envelope is
dropped (the consumer stays up), an envelope whose body is refused marks its task FAILURE."""

from __future__ import annotations

import logging
import secrets
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from celery.worker.consumer import Consumer as CeleryConsumer
from kombu import Connection, Consumer, Exchange, Queue
from kombu.transport import redis as kombu_redis

from producer.app import make_app
from worker.lifecycle.consumer import FramefleetConsumer, install_brpop_guard


def test_the_guard_is_installed_once() -> None:
    install_brpop_guard()
    guarded = kombu_redis.Channel._brpop_read
    install_brpop_guard()
    assert kombu_redis.Channel._brpop_read is guarded
    assert getattr(guarded, "framefleet_guard", False)


def test_an_item_that_is_not_an_envelope_is_dropped(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    install_brpop_guard()
    name = f"guard-{secrets.token_hex(4)}"
    received: list[Any] = []
    with Connection(redis_url) as conn:
        queue = Queue(name, Exchange(name, type="direct"), routing_key=name)
        producer = conn.Producer(serializer="json")
        # Given raw bytes pushed onto the queue's list by hand, then a real message
        r = redis.Redis.from_url(redis_url)
        queue(conn.default_channel).declare()
        r.lpush(name, b"this is not a message at all")
        producer.publish({"n": 1}, exchange=queue.exchange, routing_key=name, declare=[queue])
        # When a consumer drains the queue
        def on_message(body: Any, message: Any) -> None:
            received.append(body)
            message.ack()

        with caplog.at_level(logging.CRITICAL, logger="worker.lifecycle.consumer"), Consumer(
            conn, [queue], accept=["json"], callbacks=[on_message],
        ):
            for _ in range(4):
                if received:
                    break
                try:
                    conn.drain_events(timeout=2)
                except TimeoutError:
                    pass
        # Then the bad item was dropped with a critical log and the message still arrived
        assert received == [{"n": 1}]
        assert "not a message envelope" in caplog.text
        assert r.llen(name) == 0


def test_a_refused_body_marks_its_task_failure(redis_url: str) -> None:
    app = make_app(redis_url, redis_url)
    # The consumer of a worker that is not started: only its decode-error path runs here
    # (the controller is read once, for the event loop kind).
    consumer = FramefleetConsumer(lambda *a: None, app=app, hostname="guard@test", pool=None,
                                  timer=None, controller=SimpleNamespace(use_eventloop=False))
    name = f"refused-{secrets.token_hex(4)}"
    task_id = f"pickled-{secrets.token_hex(4)}"
    decoded: list[Any] = []
    with Connection(redis_url) as conn:
        queue = Queue(name, Exchange(name, type="direct"), routing_key=name)
        # Given a well-formed envelope whose body is pickle, which the fleet refuses
        conn.Producer(serializer="pickle").publish(
            {"x": 1}, exchange=queue.exchange, routing_key=name, declare=[queue],
            headers={"id": task_id, "task": "framefleet.decode_video"})
        # When the consumer receives it
        with Consumer(conn, [queue], accept=["json"], callbacks=[lambda b, m: decoded.append(b)],
                      on_decode_error=consumer.on_decode_error):
            conn.drain_events(timeout=5)
    # Then nothing ran, and the submitter sees FAILURE saying why (not PENDING forever)
    assert decoded == []
    meta = app.backend.get_task_meta(task_id)
    assert meta["status"] == "FAILURE"
    assert "JSON only" in str(meta["result"])
    assert isinstance(consumer, CeleryConsumer)
