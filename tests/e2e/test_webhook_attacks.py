"""Webhooks as a weapon: a job that aims its notify URLs at the fleet's own services, hides an
address in a numeric host form, or answers one byte at a time. Real worker, real Redis and
SeaweedFS, receivers on loopback."""

from __future__ import annotations

import itertools
import json
import re
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from producer.app import QUEUE, TASK_NAME
from producer.client import Client, JobHandle
from producer.errors import InvalidJobError, JobFailed
from producer.wire.spec import JobSpec, NotifySpec, job_key
from tests.e2e.helpers import pattern_spec, put_latents, verify_output
from tests.e2e.webhook_fleet import SECRET, Fleet, start_fleet
from tests.receiver import Receiver, Trickler
from tests.require import require_binary
from tests.services.redis_server import REDIS_INSTALL, RedisServer

pytestmark = pytest.mark.e2e

DEADLINE_S = 5.0  # FRAMEFLEET_WEBHOOK_TIMEOUT_S: one whole delivery attempt
HOST_ONLY = "127.0.0.1/32"
REFUSED_PORT = r"^notify\.urls\[0\]: port {port} of 127\.0\.0\.1 not allowed \(FRAMEFLEET_" \
               r"WEBHOOK_HOSTS: '127\.0\.0\.1/32' is host-only: http's default port 80 only"


@pytest.fixture
def fleet(redis_url: str, monkeypatch: pytest.MonkeyPatch, worker_factory: Any) -> Iterator[Fleet]:
    """``fleet(*ports, workers=1, **env)``: a client and workers sharing an allow-list."""
    yield from start_fleet(redis_url, monkeypatch, worker_factory)


def _spec(s3: Any, bucket: str, job_id: str, *urls: str, frames: int = 12) -> JobSpec:
    uri = put_latents(s3, bucket, f"in/{job_id}.npy", latent_frames=frames, fmt="npy")
    return pattern_spec(job_id, uri, bucket, segment_frames=12, notify=NotifySpec(
        urls=urls, events=("started", "segment", "succeeded", "failed")))


def _raw(client: Client, spec: JobSpec) -> JobHandle:
    """Send the spec as a hand-written producer would: past every client-side check."""
    key = job_key(spec.tenant, spec.job_id)
    client.app.send_task(TASK_NAME, args=[spec.model_dump(mode="json")], task_id=key)
    return JobHandle(client.app, key)


def _volumes(master: int) -> int:
    """Volumes the SeaweedFS master knows of (its /vol/status)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{master}/vol/status", timeout=10) as r:
        status = json.load(r)

    def count(node: Any) -> int:
        if isinstance(node, dict):
            return int("Id" in node) + sum(count(v) for v in node.values())
        if isinstance(node, list):
            return sum(count(v) for v in node)
        return 0

    return count(status["Volumes"])


def _refused_everywhere(client: Client, spec: JobSpec, why: str) -> None:
    """Refused at submit (nothing queued), and refused by the worker when sent raw."""
    with pytest.raises(InvalidJobError, match=why):
        client.submit(spec)
    assert client.get(spec.job_id).status() == "PENDING"
    assert redis.Redis.from_url(client.app.conf.broker_url).llen(QUEUE) == 0
    with pytest.raises(JobFailed, match=r"InvalidJobError: notify\.urls\[0\]: port"):
        _raw(client, spec).wait(timeout=60)


def test_the_fleets_own_services_are_out_of_reach(
    fleet: Fleet, s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    # Given a real Redis aside, SeaweedFS's master, and a host-only entry for 127.0.0.1
    target = RedisServer(require_binary("redis-server", REDIS_INSTALL), tmp_path / "target")
    target.start()
    master = s3.ports["master.port"]
    try:
        with Receiver() as rx:
            client = fleet(workers=1, FRAMEFLEET_WEBHOOK_HOSTS=f"{HOST_ONLY},{rx.url()}")
            # (every object written first: writes may grow the bucket's volumes)
            grow = f"http://127.0.0.1:{master}/vol/grow?count=1"
            to_grow = _spec(s3, s3_bucket, "grow", grow)
            to_redis = _spec(s3, s3_bucket, "rds", target.url.replace("redis://", "http://"))
            warm = client.submit(_spec(s3, s3_bucket, "warm", rx.url())).wait(timeout=90)
            after_spec = _spec(s3, s3_bucket, "after", rx.url())
            probe = redis.Redis(port=target.port, socket_timeout=5)
            before = (_volumes(master), probe.info("stats")["total_connections_received"])
            # When jobs aim their webhooks at /vol/grow and at Redis's port
            _refused_everywhere(client, to_grow, REFUSED_PORT.format(port=master))
            _refused_everywhere(client, to_redis, REFUSED_PORT.format(port=target.port))
            time.sleep(1.0)
            after = (_volumes(master), probe.info("stats")["total_connections_received"])
            # (and the worker stays healthy: the next job's webhooks are delivered)
            result = client.submit(after_spec).wait(timeout=90)
            verify_output(s3, s3_bucket, result, tmp_path)
            got = rx.wait(2 * (2 + len(warm.manifest.segments)), timeout=30)
            assert got[-1].json["event"] == "succeeded" and got[-1].verifies(SECRET)
            assert got[-1].json["job_id"] == "after"
        # Then SeaweedFS grew no volume, and Redis saw no connection, let alone HTTP
        assert before[0] > 0
        assert after == before
        assert "SECURITY ATTACK" not in target.log_text()
        # (the checks can see an attack: the same two requests, made by hand, are seen)
        urllib.request.urlopen(grow, timeout=30).read()
        assert _volumes(master) > before[0]
        with socket.create_connection(("127.0.0.1", target.port), timeout=5) as sock:
            sock.sendall(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            sock.recv(100)
        deadline = time.monotonic() + 5
        while "SECURITY ATTACK" not in target.log_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "SECURITY ATTACK" in target.log_text()
    finally:
        target.stop()


@pytest.mark.parametrize(("host", "address"), [
    ("2852039166", "169.254.169.254"),
    ("0xa9fea9fe", "169.254.169.254"),
    ("0251.0376.0251.0376", "169.254.169.254"),
    ("169.254.43518", "169.254.169.254"),
    ("127.1", "127.0.0.1"),
    ("0x7f.1", "127.0.0.1"),
    ("[::ffff:169.254.169.254]", "169.254.169.254"),
    ("[::ffff:7f00:1]", "127.0.0.1"),
])
def test_numeric_host_forms_are_refused_at_submit_under_the_empty_list(
    fleet: Fleet, s3: Any, s3_bucket: str, host: str, address: str
) -> None:
    client = fleet(workers=0, FRAMEFLEET_WEBHOOK_HOSTS="")
    spec = _spec(s3, s3_bucket, "numeric", "http://ok.example.com/", f"http://{host}/x")
    with pytest.raises(InvalidJobError, match=rf"^notify\.urls\[1\]: address "
                                              rf"{re.escape(address)} is not public"):
        client.submit(spec)
    assert redis.Redis.from_url(client.app.conf.broker_url).llen(QUEUE) == 0


def test_a_trickling_receiver_holds_no_delivery_past_the_deadline(
    fleet: Fleet, s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    # Given a receiver that answers one byte every 2 s for 45 s, and two honest ones that
    # take 0.2 s per answer
    with Trickler(interval_s=2.0, total_s=45.0) as slow, \
            Receiver(delay_s=0.2) as a, Receiver(delay_s=0.2) as b:
        client = fleet(slow.port, a.port, b.port, FRAMEFLEET_WEBHOOK_TIMEOUT_S=str(DEADLINE_S),
                       FRAMEFLEET_WEBHOOK_THREADS="4")
        t0 = time.monotonic()
        client.submit(_spec(s3, s3_bucket, "to-trickler", slow.url())).wait(timeout=90)
        slow.wait(1, timeout=30)
        # When a second job notifies the honest receivers while the trickler trickles
        t1 = time.monotonic()
        second = client.submit(_spec(s3, s3_bucket, "to-honest", a.url(), b.url(), frames=30))
        result = second.wait(timeout=90)
        expected = 1 + len(result.manifest.segments) + 1
        got_a, got_b = a.wait(expected, timeout=30), b.wait(expected, timeout=30)
        # Then its first event came within the deadline and a few seconds of the submit
        assert got_a[0].at - t1 < DEADLINE_S + 3, got_a[0].at - t1
        assert got_b[0].at - t1 < DEADLINE_S + 3, got_b[0].at - t1
        # all of them in order, one at a time per receiver (0.2 s per answer)
        for got in (got_a, got_b):
            assert [r.json["sequence"] for r in got] == list(range(1, expected + 1))
            gaps = [later.at - earlier.at for earlier, later in itertools.pairwise(got)]
            assert min(gaps) >= 0.19, gaps
        # while the trickler was still trickling (its 45 s are not over)
        assert time.monotonic() - t0 < 45
        # and each connection to the trickler was cut at the deadline
        deadline = time.monotonic() + DEADLINE_S + 3
        while slow.connections[0].closed is None and time.monotonic() < deadline:
            time.sleep(0.1)
        for conn in slow.connections:
            if conn.closed is not None:
                assert conn.closed - conn.accepted < DEADLINE_S + 1.5, conn
        first = slow.connections[0]
        assert first.closed is not None, "the first delivery outlived its deadline"
        assert first.sent <= DEADLINE_S / 2.0 + 2, first
        # The worker is healthy: a job without webhooks runs at once
        after = client.submit(pattern_spec("after", put_latents(
            s3, s3_bucket, "in/after.npy", 3, fmt="npy"), s3_bucket)).wait(timeout=60)
        verify_output(s3, s3_bucket, after, tmp_path)
