"""Webhooks without Celery: the allow-list, signatures, ordered retries, isolation."""

from __future__ import annotations

import ipaddress
import ssl
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from producer.errors import InvalidJobError
from producer.settings import Settings
from producer.webhooks.rules import (
    DELIVERY_HEADER,
    EVENT_HEADER,
    TIMESTAMP_HEADER,
    signature,
    verify,
)
from producer.wire.spec import (
    InputSpec,
    JobSpec,
    NotifySpec,
    OutputSpec,
    Progress,
    SegmentInfo,
    parse_spec,
)
from tests.receiver import Receiver
from tests.require import require_binary
from worker.sinks.webhooks import Address, Notifier, retry_after_s

SECRET = "s3cr3t-for-tests"


def _settings(**kw: Any) -> Settings:
    base: dict[str, Any] = {
        "webhook_secret": SECRET, "webhook_schemes": "http",
        "webhook_timeout_s": 2.0, "webhook_backoff_s": 0.2, "webhook_backoff_max_s": 1.0,
    }
    return Settings(**{**base, **kw})


def _spec(*urls: str, events: tuple[str, ...] = ("started", "segment", "succeeded")) -> JobSpec:
    return JobSpec(job_id="n1", input=InputSpec(uri="s3://b/z.npy"),
                   output=OutputSpec(uri="s3://b/out"),
                   notify=NotifySpec(urls=urls, events=events))  # type: ignore[arg-type]


def _notifier(made: list[Notifier], *ports: int, **kw: Any) -> Notifier:
    """A notifier whose allow-list is ``http://127.0.0.1:<port>`` for each of ``ports``
    (unless ``webhook_hosts`` is given)."""
    resolver = kw.pop("resolver", None)
    kw.setdefault("webhook_hosts", ",".join(f"http://127.0.0.1:{p}" for p in ports))
    n = Notifier(_settings(**kw), **({"resolver": resolver} if resolver else {}))
    made.append(n)
    return n


# -- the spec and signatures (the allow-list's own tests: tests/producer/test_webhooks.py) ----


def test_the_spec_refuses_what_is_not_an_http_url() -> None:
    with pytest.raises(InvalidJobError, match=r"notify\.urls\[0\]: expected an http\(s\)"):
        parse_spec({**_spec("https://a.example.com/").model_dump(mode="json"),
                    "notify": {"urls": ["file:///etc/passwd"]}})


def test_specs_without_the_new_fields_keep_their_digest() -> None:
    spec = JobSpec.model_validate(
        {"job_id": "a", "input": {"uri": "s3://b/k.npy"}, "output": {"uri": "s3://b/o"}})
    # Computed by the code before notify and first_segment_frames existed
    assert spec.digest() == "f2b462ec709cc9a27b6606185ca1ca4c5b337e1039e1a3fce66db6398b02e6a6"
    assert _spec("https://a.example.com/").digest() != spec.digest()


def test_signature_verifies_and_refuses_tampering_and_replays() -> None:
    body = b'{"event":"succeeded"}'
    now = int(time.time())
    signed = signature(SECRET, now, body)
    assert signed.startswith("sha256=") and len(signed) == 7 + 64
    assert verify(SECRET, str(now), signed, body)
    assert not verify("other", str(now), signed, body)
    assert not verify(SECRET, str(now), signed, body + b" ")
    assert not verify(SECRET, str(now + 1), signed, body)  # the timestamp is signed too
    assert not verify(SECRET, str(now), signed, body, now=now + 301)  # a replay, later


# -- delivery ---------------------------------------------------------------------------------


def _emit_three(n: Notifier, url: str) -> None:
    events = n.for_job(_spec(url))
    events.started("node-a")
    seg = {"index": 0, "uri": "s3://b/out/default/n1/segment-00000.mp4", "first_frame": 0,
           "frames": 4, "bytes": 10, "sha256": "0" * 64, "seconds": 0.25}
    events.segment(SegmentInfo(**seg), Progress(frames_done=4, frames_total=8, segments_done=1))
    events.emit("failed", {"ignored": True})  # not among the job's events: not sent
    events.emit("succeeded", {"result": "stand-in"})


def test_signed_events_arrive_in_order_through_retries(notifiers: list[Notifier]) -> None:
    with Receiver(statuses=(503, 500)) as rx:
        n = _notifier(notifiers, rx.port)
        _emit_three(n, rx.url())
        got = rx.wait(5, timeout=20)
    # The first event was refused twice, retried with back-off, and held the others back
    assert [r.json["event"] for r in got] == ["started"] * 3 + ["segment", "succeeded"]
    assert got[1].at - got[0].at >= 0.19 and got[2].at - got[1].at >= 0.39
    assert [r.json["sequence"] for r in got] == [1, 1, 1, 2, 3]
    assert len({r.headers[DELIVERY_HEADER] for r in got}) == 3  # retries keep their id
    for r in got:
        assert r.verifies(SECRET), r.headers
        assert r.headers[EVENT_HEADER] == r.json["event"]
        assert r.headers["Content-Type"] == "application/json"
        assert abs(int(r.headers[TIMESTAMP_HEADER]) - time.time()) < 60
    segment = got[3].json["data"]
    assert segment["progress"]["frames_done"] == 4
    assert segment["playlist_uri"] == "s3://b/out/default/n1/index.m3u8"
    assert n.sent == 3 and n.given_up == 0


@pytest.mark.parametrize(("value", "seconds"), [
    ("7", 7.0), (" 0 ", 0.0), ("Tue, 01 Dec 2026 14:00:30 GMT", 30.0),
    ("Tue, 01 Dec 2026 13:00:00 GMT", 0.0), ("soon", None), ("-5", None), ("", None),
    ("1.5", None), ("\u0663", None), (None, None),
])
def test_retry_after_reads_seconds_and_http_dates(value: str | None, seconds: float | None) -> None:
    now = 1796133600.0  # Tue, 01 Dec 2026 14:00:00 GMT
    assert retry_after_s(value, now) == seconds


def test_retry_after_delays_the_retry_beyond_the_back_off(notifiers: list[Notifier]) -> None:
    # Given a receiver that is rate-limiting (429, Retry-After: 2) and a back-off of 0.2 s
    with Receiver(statuses=(429,), retry_after="2") as rx:
        n = _notifier(notifiers, rx.port)
        n.for_job(_spec(rx.url(), events=("started",))).started("node-a")
        got = rx.wait(2, timeout=15)
    # Then the second attempt came after the 2 s it asked for, not after 0.2 s
    assert got[1].at - got[0].at >= 1.95, [r.at for r in got]
    assert got[1].headers[DELIVERY_HEADER] == got[0].headers[DELIVERY_HEADER]
    assert n.sent == 1


def test_a_retry_after_beyond_the_age_limit_gives_up_without_hammering(
    notifiers: list[Notifier],
) -> None:
    # Given a receiver that asks for an hour, and events that may live 30 s
    with Receiver(statuses=(503, 503, 503), retry_after="3600") as rx:
        n = _notifier(notifiers, rx.port, webhook_max_age_s=30.0)
        n.for_job(_spec(rx.url(), events=("started",))).started("node-a")
        rx.wait(1, timeout=10)
        deadline = time.monotonic() + 10
        while n.given_up == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.5)  # a back-off retry would have come by now (0.2 s)
    # Then it was given up after the one attempt
    assert len(rx.received) == 1
    assert n.given_up == 1 and n.sent == 0


def test_redirects_are_not_followed(notifiers: list[Notifier]) -> None:
    with Receiver(statuses=(302,), location="/elsewhere") as rx:
        n = _notifier(notifiers, rx.port)
        n.for_job(_spec(rx.url(), events=("started",))).started("node-a")
        rx.wait(1, timeout=10)
        deadline = time.monotonic() + 10
        while n.given_up == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)
    assert [r.path for r in rx.received] == ["/hook"]
    assert n.given_up == 1 and n.sent == 0


def test_addresses_are_checked_after_dns_and_the_checked_one_is_used(
    notifiers: list[Notifier],
) -> None:
    """A listed name that resolves to loopback (DNS rebinding) is refused unless the address
    is listed too; when it is, the connection goes to that address, the name stays in Host."""
    loopback: list[Address] = [ipaddress.ip_address("127.0.0.1")]
    with Receiver() as rx:
        url = f"http://hooks.example.test:{rx.port}/hook"
        rebound = _notifier(notifiers, webhook_hosts=f"http://hooks.example.test:{rx.port}",
                            resolver=lambda host, port: loopback)
        rebound.for_job(_spec(url, events=("started",))).started("node-a")
        # 127.0.0.1 listed for the default port only: still refused for this port
        other_port = _notifier(notifiers, webhook_hosts=f"http://hooks.example.test:{rx.port},"
                               "127.0.0.1/32", resolver=lambda host, port: loopback)
        other_port.for_job(_spec(url, events=("started",))).started("node-a")
        pinned = _notifier(notifiers, webhook_hosts=f"http://hooks.example.test:{rx.port},"
                           f"http://[127.0.0.1/32]:{rx.port}",
                           resolver=lambda host, port: loopback)
        pinned.for_job(_spec(url, events=("started",))).started("node-a")
        (got,) = rx.wait(1, timeout=10)
        deadline = time.monotonic() + 10
        while rebound.given_up + other_port.given_up < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
    assert rebound.given_up == 1 and rebound.sent == 0
    assert other_port.given_up == 1 and other_port.sent == 0
    assert got.headers["Host"] == f"hooks.example.test:{rx.port}"
    assert len(rx.received) == 1


def test_a_url_refused_by_the_worker_is_skipped_and_no_secret_sends_nothing(
    notifiers: list[Notifier],
) -> None:
    with Receiver() as rx:
        n = _notifier(notifiers, rx.port)
        events = n.for_job(_spec("http://10.9.9.9/hook", rx.url(), events=("started",)))
        assert [t.url for t in events.targets] == [rx.url()]
        unsigned = _notifier(notifiers, rx.port, webhook_secret=None)
        assert unsigned.for_job(_spec(rx.url())).targets == []


def test_emit_never_blocks_on_a_dead_or_slow_receiver(notifiers: list[Notifier]) -> None:
    with Receiver(delay_s=30) as slow:
        n = _notifier(notifiers, slow.port, 9, webhook_queue=4, webhook_timeout_s=1.0)
        events = n.for_job(_spec(slow.url(), "http://127.0.0.1:9/hook", events=("segment",)))
        t0 = time.monotonic()
        for _ in range(200):
            events.emit("segment", {})
        took = time.monotonic() - t0
        # Enqueueing 400 deliveries took no delivery's time; the overflow was dropped
        assert took < 1.0, took
        assert n.dropped >= 390
        slow.wait(1, timeout=10)
        t0 = time.monotonic()
        assert not n.close(timeout=1.5)  # the slow one could not finish: bounded, reported
        assert time.monotonic() - t0 < 4.0


def test_https_verifies_the_certificate_of_the_name_over_the_pinned_address(
    notifiers: list[Notifier], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    openssl = require_binary("openssl", "Debian package openssl")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=hooks.example.test", "-addext",
                    "subjectAltName=DNS:hooks.example.test", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True, timeout=60)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    loopback: list[Address] = [ipaddress.ip_address("127.0.0.1")]
    with Receiver(tls=server) as rx:
        settings = {"webhook_schemes": "https", "webhook_max_attempts": 2,
                    "webhook_hosts": f"https://hooks.example.test:{rx.port},"
                                     f"https://[127.0.0.1/32]:{rx.port}",
                    "resolver": lambda host, port: loopback}
        url = f"https://hooks.example.test:{rx.port}/hook"
        # A certificate nobody vouches for: nothing is sent, and the event is given up
        untrusted = _notifier(notifiers, **settings)
        untrusted.for_job(_spec(url, events=("started",))).started("node-a")
        deadline = time.monotonic() + 15
        while untrusted.given_up == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert untrusted.given_up == 1 and rx.received == []
        # Trusted (SSL_CERT_FILE names it): delivered over TLS to the checked address
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        trusted = _notifier(notifiers, **settings)
        trusted.for_job(_spec(url, events=("started",))).started("node-a")
        (got,) = rx.wait(1, timeout=15)
    assert got.verifies(SECRET) and got.headers["Host"] == f"hooks.example.test:{rx.port}"
