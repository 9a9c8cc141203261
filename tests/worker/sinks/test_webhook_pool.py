"""Webhook delivery threads: the whole-attempt deadline against a trickling receiver, lanes
per receiver (in order, one at a time), receivers side by side. Real receivers on loopback."""

from __future__ import annotations

import itertools
import time
from typing import Any

from producer.settings import Settings
from producer.wire.spec import InputSpec, JobSpec, NotifySpec, OutputSpec
from tests.receiver import Receiver, Trickler
from worker.sinks.webhooks import Notifier

SECRET = "s3cr3t-for-tests"


def _spec(job_id: str, *urls: str) -> JobSpec:
    return JobSpec(job_id=job_id, input=InputSpec(uri="s3://b/z.npy"),
                   output=OutputSpec(uri="s3://b/out"),
                   notify=NotifySpec(urls=urls, events=("started", "segment", "succeeded")))


def _notifier(made: list[Notifier], *ports: int, **kw: Any) -> Notifier:
    settings: dict[str, Any] = {
        "webhook_secret": SECRET, "webhook_schemes": "http", "webhook_backoff_s": 0.2,
        "webhook_hosts": ",".join(f"http://127.0.0.1:{p}/hook" for p in ports), **kw}
    n = Notifier(Settings(**settings))
    made.append(n)
    return n


def test_a_trickling_receiver_is_cut_off_at_the_deadline(notifiers: list[Notifier]) -> None:
    # Given a receiver that answers one byte every 0.5 s for 30 s, and a 1.5 s deadline
    with Trickler(interval_s=0.5, total_s=30) as slow:
        n = _notifier(notifiers, slow.port, webhook_timeout_s=1.5, webhook_max_attempts=1)
        n.for_job(_spec("j1", slow.url())).started("node-a")
        (conn,) = slow.wait(1, timeout=10)
        deadline = time.monotonic() + 10
        while n.given_up == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        # Then the worker closed the connection at the deadline, though bytes kept coming
        assert conn.closed is not None, "the delivery still holds the connection"
        held = conn.closed - conn.accepted
        assert 1.0 <= held < 2.5, held
        assert 2 <= conn.sent <= 5
        assert n.given_up == 1 and n.sent == 0


def test_a_slow_receiver_does_not_delay_another(notifiers: list[Notifier]) -> None:
    # Given a trickling receiver (with retries, so it keeps a thread busy) and an honest one
    with Trickler(interval_s=0.5, total_s=30) as slow, Receiver() as rx:
        n = _notifier(notifiers, slow.port, rx.port, webhook_timeout_s=3.0,
                      webhook_threads=2)
        n.for_job(_spec("slow", slow.url())).started("node-a")
        slow.wait(1, timeout=10)
        t0 = time.monotonic()
        events = n.for_job(_spec("honest", rx.url()))
        events.started("node-a")
        events.emit("succeeded", {"result": "stand-in"})
        got = rx.wait(2, timeout=10)
        # Then the honest receiver had both at once, while the slow one still held its thread
        assert got[-1].at - t0 < 1.0, got[-1].at - t0
        assert slow.connections[0].closed is None
        assert [r.json["event"] for r in got] == ["started", "succeeded"]


def test_one_thread_bounds_the_wait_behind_a_trickler_by_the_deadline(
    notifiers: list[Notifier],
) -> None:
    with Trickler(interval_s=0.5, total_s=30) as slow, Receiver() as rx:
        n = _notifier(notifiers, slow.port, rx.port, webhook_timeout_s=1.5,
                      webhook_threads=1, webhook_max_attempts=1)
        n.for_job(_spec("slow", slow.url())).started("node-a")
        slow.wait(1, timeout=10)
        t0 = time.monotonic()
        n.for_job(_spec("honest", rx.url())).started("node-a")
        (got,) = rx.wait(1, timeout=10)
        assert got.at - t0 < 1.5 + 0.5, got.at - t0


def test_one_receiver_gets_its_events_one_at_a_time_in_order(notifiers: list[Notifier]) -> None:
    # Given two receivers that take 0.3 s per answer, four threads, and events of two jobs
    with Receiver(delay_s=0.3) as a, Receiver(delay_s=0.3) as b:
        n = _notifier(notifiers, a.port, b.port, webhook_threads=4)
        jobs = [n.for_job(_spec(f"j{i}", a.url(), b.url())) for i in range(2)]
        t0 = time.monotonic()
        for _ in range(3):
            for events in jobs:
                events.emit("segment", {})
        got_a, got_b = a.wait(6, timeout=20), b.wait(6, timeout=20)
        took = time.monotonic() - t0
    for got in (got_a, got_b):
        # One at a time: each request came after the previous answer (0.3 s) was given
        gaps = [later.at - earlier.at for earlier, later in itertools.pairwise(got)]
        assert min(gaps) >= 0.29, gaps
        # In the order they were emitted, across the two jobs
        assert [(r.json["job_id"], r.json["sequence"]) for r in got] == [
            (f"j{i}", s) for s in (1, 2, 3) for i in range(2)]
    # The two receivers were served side by side: ~1.8 s, not 3.6 s
    assert took < 3.0, took
    assert n.sent == 12
