"""The spot watcher against an IMDSv2 stand-in on loopback."""

from __future__ import annotations

import threading
from typing import Any

from tests.imds import ImdsStandIn
from worker.lifecycle.spot import ImdsClient, SpotWatcher


def test_no_notice_is_none_and_token_is_used() -> None:
    with ImdsStandIn() as imds:
        client = ImdsClient(imds.url)
        assert client.spot_action() is None
        assert client.spot_action() is None
        # One token for both reads (IMDSv2: PUT once, then GETs with the token header)
        assert [m for m, _ in imds.requests] == ["PUT", "GET", "GET"]


def test_expired_token_is_renewed() -> None:
    with ImdsStandIn() as imds:
        client = ImdsClient(imds.url)
        assert client.spot_action() is None
        imds.token = "rotated"
        imds.notice = {"action": "terminate", "time": "2026-11-29T12:00:00Z"}
        assert client.spot_action() == imds.notice


def test_watcher_calls_back_once_on_notice() -> None:
    with ImdsStandIn() as imds:
        got: list[dict[str, Any]] = []
        called = threading.Event()

        def on_notice(notice: dict[str, Any]) -> None:
            got.append(notice)
            called.set()

        watcher = SpotWatcher(imds.url, 0.05, on_notice)
        watcher.start()
        try:
            assert not called.wait(0.3)  # no notice yet: polling, nothing reported
            imds.notice = {"action": "stop", "time": "2026-11-29T12:02:00Z"}
            assert called.wait(5)
            watcher.join(5)
            assert not watcher.is_alive() and got == [imds.notice]
        finally:
            watcher.stop()


def test_unreachable_imds_does_not_kill_the_watcher() -> None:
    with ImdsStandIn() as imds:
        url = imds.url
    # The server is gone: the watcher keeps polling quietly until stopped.
    watcher = SpotWatcher(url, 0.05, lambda n: None)
    watcher.start()
    watcher.join(0.3)
    assert watcher.is_alive()
    watcher.stop()
    watcher.join(5)
    assert not watcher.is_alive()
