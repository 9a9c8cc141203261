"""The fleet exporter against a real Redis broker; CloudWatch checked by botocore's Stubber."""

from __future__ import annotations

import logging
import secrets
import threading
import time
from typing import Any

import boto3
import pytest
import redis
from botocore.stub import Stubber

from producer.app import ENQUEUED_AT_HEADER, QUEUE, TASK_NAME, make_app
from producer.client import Client
from producer.ops import exporter
from producer.ops.cloudwatch import put_queue_depth
from producer.state import keys
from producer.wire.spec import DecoderSpec, InputSpec, JobSpec, OutputSpec
from tests.blocked_imports import import_blocked
from tests.services import free_port
from tests.worker.test_metrics import scrape, value


def test_queue_depth_sums_celery_priority_lists(redis_url: str) -> None:
    queue = f"video-{secrets.token_hex(4)}"
    app = make_app(broker_url=redis_url, backend_url=redis_url)
    try:
        # When real Celery messages are sent with several priorities (kombu: one list each).
        for priority in (0, 0, 3, 5, 9):
            app.send_task(TASK_NAME, args=[{}], queue=queue, priority=priority)
    finally:
        app.close()
    client = redis.Redis.from_url(redis_url)
    try:
        lists = [k for k in client.keys(f"{queue}*") if client.type(k) == b"list"]
        assert len(lists) >= 3  # the messages really are spread over priority lists
        # And a list in the ":" form, as a transport with sep=":" would write it.
        client.lpush(f"{queue}:7", b"{}")
    finally:
        client.close()
    assert exporter.queue_depth(redis_url, queue) == 6
    assert exporter.queue_depth(redis_url, f"absent-{queue}") == 0


def test_exporter_serves_queue_depth_and_puts_it_to_cloudwatch(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    queue = f"video-{secrets.token_hex(4)}"
    client = redis.Redis.from_url(redis_url)
    client.lpush(queue, b"a", b"b")
    client.lpush(f"{queue}\x06\x163", b"c")
    client.close()
    # CloudWatch itself is out of reach: botocore's Stubber checks the exact request instead.
    cloudwatch = boto3.client(
        "cloudwatch", region_name="us-east-2", aws_access_key_id="x", aws_secret_access_key="x"
    )
    stubber = Stubber(cloudwatch)
    expected = {
        "Namespace": "Framefleet",
        "MetricData": [
            {
                "MetricName": "QueueDepth",
                "Dimensions": [{"Name": "Queue", "Value": queue}],
                "Value": 3.0,
                "Unit": "Count",
            }
        ],
    }
    for _ in range(50):
        stubber.add_response("put_metric_data", {}, expected)
    port = free_port()
    stop = threading.Event()
    thread = threading.Thread(
        target=exporter.run_exporter,
        args=(redis_url, port, True, 0.1),
        kwargs={
            "queues": [queue],
            "addr": "127.0.0.1",
            "stop": stop,
            "cloudwatch_client": cloudwatch,
        },
        daemon=True,
    )
    with stubber:
        thread.start()
        try:
            deadline = time.monotonic() + 10
            depth = 0.0
            while time.monotonic() < deadline:
                try:
                    depth = value(scrape(port), "framefleet_queue_depth", queue=queue)
                except OSError:
                    depth = 0.0  # not listening yet
                if depth == 3:
                    break
                time.sleep(0.05)
            assert depth == 3
        finally:
            stop.set()
            thread.join(10)
    assert not thread.is_alive()
    # At least one put was made, and each matched the expected request (a mismatch is logged).
    assert len(stubber._queue) < 50  # type: ignore[attr-defined]
    assert "put_metric_data failed" not in caplog.text


def _cloudwatch() -> Any:
    return boto3.client(
        "cloudwatch", region_name="us-east-2", aws_access_key_id="x", aws_secret_access_key="x"
    )


def test_cloudwatch_failure_is_logged_and_the_prometheus_series_still_set(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    queue = f"video-{secrets.token_hex(4)}"
    client = redis.Redis.from_url(redis_url)
    cloudwatch = _cloudwatch()
    stubber = Stubber(cloudwatch)
    stubber.add_client_error("put_metric_data", "Throttling", http_status_code=400)
    stubber.add_response("put_metric_data", {})
    try:
        client.lpush(queue, b"a")
        with stubber, caplog.at_level(logging.WARNING, logger="producer.ops.cloudwatch"):
            exporter.export_once(client, [queue], cloudwatch)
            gauge = exporter.EXPORTER_REGISTRY.get_sample_value(
                "framefleet_queue_depth", {"queue": queue}
            )
            assert gauge == 1
            assert "put_metric_data failed" in caplog.text
            # The next put goes through and says so.
            assert put_queue_depth(cloudwatch, queue, 1) is True
            stubber.assert_no_pending_responses()
    finally:
        client.close()


def test_unreadable_broker_removes_the_series_instead_of_a_stale_value(redis_url: str) -> None:
    queue = f"video-{secrets.token_hex(4)}"
    good = redis.Redis.from_url(redis_url)
    # Nothing listens on a fresh free port: every read is refused at once.
    down = redis.Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=1)
    try:
        good.lpush(queue, b"a", b"b")
        exporter.export_once(good, [queue])
        sample = ("framefleet_queue_depth", {"queue": queue})
        assert exporter.EXPORTER_REGISTRY.get_sample_value(*sample) == 2
        exporter.export_once(down, [queue])
        assert exporter.EXPORTER_REGISTRY.get_sample_value(*sample) is None
    finally:
        good.close()
        down.close()


def test_queue_names_cover_every_priority_step() -> None:
    names = keys.queue_lists("video")
    assert names[0] == "video"
    assert "video\x06\x169" in names and "video:1" in names
    assert len(names) == len(set(names)) == 1 + 2 * 9


def test_exporter_imports_without_the_worker_extra() -> None:
    # The exporter runs in the producer image, which has the [ops] extra but no torch or av.
    done = import_blocked(["producer.ops.exporter", "producer.ops.cloudwatch"],
                          ["torch", "av", "diffusers", "safetensors", "pynvml", "numpy"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def _other_db(redis_url: str, db: int) -> str:
    """The same server, another database: a queue of its own for the client's "video"."""
    return redis_url.rsplit("/", 1)[0] + f"/{db}"


def test_the_client_stamps_what_the_exporter_reads(redis_url: str, tmp_path: Any) -> None:
    url = _other_db(redis_url, 7)
    r = redis.Redis.from_url(url)
    r.flushdb()
    client = Client(broker_url=url, backend_url=url)
    spec = JobSpec(job_id=f"s-{secrets.token_hex(4)}",
                   input=InputSpec(uri=f"file://{tmp_path}/z.npy"),
                   decoder=DecoderSpec(name="pattern"),
                   output=OutputSpec(uri=f"file://{tmp_path}/out"), priority=7)
    try:
        # When the client sends a job (at a priority step of its own list).
        before = time.time()
        client.submit(spec)
        after = time.time()
        (name,) = [n for n in keys.queue_lists(QUEUE) if r.llen(n)]
        assert name != QUEUE  # a priority list, not the plain one
        # Then its message carries the enqueue stamp the exporter reads.
        stamp = exporter.enqueued_at(r.lindex(name, -1))
        assert stamp is not None and before <= stamp <= after
        exporter.export_once(r, [QUEUE], now=stamp + 42.5)
        age = exporter.EXPORTER_REGISTRY.get_sample_value(
            "framefleet_queue_oldest_age_seconds", {"queue": QUEUE})
        assert age == pytest.approx(42.5)
    finally:
        client.app.close()
        r.flushdb()
        r.close()


def test_oldest_age_is_the_longest_wait_over_every_priority_list(redis_url: str) -> None:
    queue = f"video-{secrets.token_hex(4)}"
    app = make_app(broker_url=redis_url, backend_url=redis_url)
    client = redis.Redis.from_url(redis_url)
    sample = ("framefleet_queue_oldest_age_seconds", {"queue": queue})
    try:
        # An empty queue: nobody waits, the age is 0 (and the alert resolves).
        exporter.export_once(client, [queue], now=1000.0)
        assert exporter.EXPORTER_REGISTRY.get_sample_value(*sample) == 0
        # Messages the way the client sends them, stamped, at three priority steps.
        for priority, stamp in ((0, 900.0), (5, 400.0), (9, 700.0), (0, 950.0)):
            app.send_task(TASK_NAME, args=[{}], queue=queue, priority=priority,
                          headers={ENQUEUED_AT_HEADER: stamp})
        exporter.export_once(client, [queue], now=1000.0)
        assert exporter.EXPORTER_REGISTRY.get_sample_value(*sample) == 600.0
        # A clock behind the client's never makes a negative age.
        exporter.export_once(client, [queue], now=100.0)
        assert exporter.EXPORTER_REGISTRY.get_sample_value(*sample) == 0
    finally:
        app.close()
        client.close()


def test_unstamped_messages_leave_the_age_unknown_not_zero(redis_url: str) -> None:
    queue = f"video-{secrets.token_hex(4)}"
    app = make_app(broker_url=redis_url, backend_url=redis_url)
    client = redis.Redis.from_url(redis_url)
    try:
        app.send_task(TASK_NAME, args=[{}], queue=queue)  # an older client: no stamp
        client.lpush(queue, b"not even JSON")
        exporter.export_once(client, [queue], now=1000.0)
        age = exporter.EXPORTER_REGISTRY.get_sample_value(
            "framefleet_queue_oldest_age_seconds", {"queue": queue})
        assert age is None
        assert exporter.EXPORTER_REGISTRY.get_sample_value(
            "framefleet_queue_depth", {"queue": queue}) == 2
    finally:
        app.close()
        client.close()


def test_undecodable_messages_are_counted_on_the_broker_and_served(redis_url: str) -> None:
    url = _other_db(redis_url, 8)
    broker = redis.Redis.from_url(url)
    broker.delete(keys.UNDECODABLE)
    labels = {"status": "failure", "reason": "InvalidJobError", "tenant": "unknown"}
    try:
        exporter.export_once(broker, [])
        assert exporter.EXPORTER_REGISTRY.get_sample_value("framefleet_jobs_total", labels) == 0
        for _ in range(3):
            exporter.count_undecodable(url)
        exporter.count_undecodable("filesystem://")  # embedded mode: no Redis, no error
        exporter.export_once(broker, [])
        assert exporter.EXPORTER_REGISTRY.get_sample_value("framefleet_jobs_total", labels) == 3
    finally:
        broker.delete(keys.UNDECODABLE)
        broker.close()


def test_framefleet_exporter_exits_0_on_sigterm(redis_url: str, tmp_path: Any) -> None:
    import os
    import signal
    import subprocess
    import sys

    port = free_port()
    env = {**os.environ, "FRAMEFLEET_BROKER_URL": redis_url, "FRAMEFLEET_EXPORTER_PORT": str(port),
           "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "exporter.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "producer.cli", "exporter", "--interval",
                                 "1"], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        # Given the exporter serving its series
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if any(name == "framefleet_queue_depth" for name, _ in scrape(port)):
                    break
            except OSError:
                pass
            time.sleep(0.2)
        else:
            raise AssertionError(log.read_text()[-3000:])
        # When it is asked to stop, it exits 0 (not 143: killed by the signal), quietly
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()[-3000:]
        assert "Traceback" not in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
