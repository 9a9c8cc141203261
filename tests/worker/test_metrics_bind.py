"""/metrics and the exporter listen on loopback unless FRAMEFLEET_METRICS_ADDR says otherwise."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import psutil
import pytest

from producer.errors import SettingsError
from producer.ops import exporter
from producer.settings import Settings, get_settings
from tests.services import free_port
from worker import metrics


def other_address() -> str | None:
    """An IPv4 address of this machine that is not loopback (None if it has none)."""
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return str(a.address)
    return None


def reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture
def addr_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    get_settings.cache_clear()
    yield monkeypatch
    metrics.stop_metrics_server()
    get_settings.cache_clear()


def test_default_is_loopback_and_the_setting_is_checked() -> None:
    assert str(Settings().metrics_addr) == "127.0.0.1"
    assert str(Settings(metrics_addr="0.0.0.0").metrics_addr) == "0.0.0.0"  # type: ignore[arg-type]
    with pytest.raises(SettingsError, match="FRAMEFLEET_METRICS_ADDR"):
        Settings(metrics_addr="everywhere")  # type: ignore[arg-type]


def test_worker_metrics_not_reachable_off_loopback_by_default(addr_env: pytest.MonkeyPatch
                                                              ) -> None:
    addr_env.delenv("FRAMEFLEET_METRICS_ADDR", raising=False)
    port = metrics.start_metrics_server(free_port())
    assert metrics._server is not None
    assert metrics._server.server_address[0] == "127.0.0.1"
    assert reachable("127.0.0.1", port)
    other = other_address()
    if other is not None:
        assert not reachable(other, port)
    metrics.stop_metrics_server()
    # Set: reachable on the machine's other address too
    addr_env.setenv("FRAMEFLEET_METRICS_ADDR", "0.0.0.0")
    get_settings.cache_clear()
    port = metrics.start_metrics_server(free_port())
    assert metrics._server.server_address[0] == "0.0.0.0"
    assert reachable("127.0.0.1", port)
    if other is not None:
        assert reachable(other, port)


@pytest.mark.parametrize("addr", [None, "0.0.0.0"])
def test_exporter_binds_the_setting(addr: str | None, addr_env: pytest.MonkeyPatch,
                                    redis_url: str) -> None:
    if addr is None:
        addr_env.delenv("FRAMEFLEET_METRICS_ADDR", raising=False)
    else:
        addr_env.setenv("FRAMEFLEET_METRICS_ADDR", addr)
    get_settings.cache_clear()
    port, stop = free_port(), threading.Event()
    thread = threading.Thread(target=exporter.run_exporter, args=(redis_url, port, False, 0.1),
                              kwargs={"stop": stop}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not reachable("127.0.0.1", port):
            assert time.monotonic() < deadline, "exporter not listening"
            time.sleep(0.05)
        other = other_address()
        if other is not None:
            assert reachable(other, port) == (addr == "0.0.0.0")
    finally:
        stop.set()
        thread.join(10)
