"""The launcher: GPU selection, pinning, and supervising real worker processes."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import redis

from producer.app import make_app
from producer.settings import Settings
from tests.services import free_port
from worker.lifecycle import launcher as launcher_module
from worker.lifecycle.launcher import (
    HostNames,
    Launcher,
    WorkerSlot,
    check_metrics_ports,
    drain_timeout_s,
    parse_gpus,
    plan_for,
    plan_workers,
)

ROOT = Path(__file__).resolve().parents[3]

# ``framefleet worker`` (it execs ``python -m worker``) under a host name of the test's own:
# the launcher names its workers ``cpu<j>@<name>`` and reserves those names, so a
# ``framefleet worker --cpu`` that a user runs on this host (``cpu0@<real host>``) takes none
# of the test's names or indices, and the test sees only its own workers.
_LAUNCH = ("import socket, sys; name = sys.argv.pop(1); socket.gethostname = lambda: name; "
           "from worker.__main__ import main; sys.exit(main(sys.argv[1:]))")


def _launcher_argv(cpu: int, host: str) -> list[str]:
    return [sys.executable, "-c", _LAUNCH, host, "--cpu", str(cpu)]


@pytest.fixture
def own_host(monkeypatch: pytest.MonkeyPatch) -> str:
    """A host name no other process on this machine uses, for the node names of this test's
    launchers (in this process too: ``plan_for`` reserves ``<slot>@<host>``)."""
    host = f"ff-test-{secrets.token_hex(4)}"
    monkeypatch.setattr(socket, "gethostname", lambda: host)
    return host


@pytest.mark.parametrize(
    ("value", "available", "expected"),
    [("all", 4, [0, 1, 2, 3]), ("2", 4, [0, 1]), ("0", 2, [0]), ("0,2", 4, [0, 2]),
     ("1,0", 2, [1, 0])],
)
def test_parse_gpus(value: str, available: int, expected: list[int]) -> None:
    assert parse_gpus(value, available) == expected


@pytest.mark.parametrize(("value", "available"), [("5", 4), ("0,0", 2), ("3", 2), ("0,7", 4),
                                                ("foo", 2), ("0,x", 2), ("-1", 2), (",", 2)])
def test_parse_gpus_rejects(value: str, available: int) -> None:
    with pytest.raises(ValueError, match="--gpus"):
        parse_gpus(value, available)


def test_one_pinned_worker_per_gpu() -> None:
    slots = plan_workers([0, 2], cpu=1, metrics_port=9400)
    assert [s.name.split("@")[0] for s in slots] == ["gpu0", "gpu2", "cpu0"]
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in slots] == ["0", "2", ""]
    assert [s.env["FRAMEFLEET_METRICS_PORT"] for s in slots[:2]] == ["9400", "9402"]
    assert slots[0].env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert slots[2].env["FRAMEFLEET_DEVICE"] == "cpu"
    assert slots[0].env["FRAMEFLEET_WARMUP_DECODER"] == "wan2.1-vae"
    assert "FRAMEFLEET_WARMUP_DECODER" not in slots[2].env


def test_gpu_workers_warm_up_the_configured_decoder() -> None:
    # FRAMEFLEET_WARMUP_DECODER goes through the settings; unset, GPU workers warm up Wan
    configured = plan_for([1], 0, Settings(warmup_decoder="pattern", metrics_port=9500))
    default = plan_for([1], 0, Settings(warmup_decoder=None))
    assert configured[0].env["FRAMEFLEET_WARMUP_DECODER"] == "pattern"
    assert configured[0].env["FRAMEFLEET_METRICS_PORT"] == "9501"
    assert default[0].env["FRAMEFLEET_WARMUP_DECODER"] == "wan2.1-vae"


def _nodes(app: object, timeout: float = 1.0) -> set[str]:
    replies = app.control.ping(timeout=timeout) or []  # type: ignore[attr-defined]
    return {name for reply in replies for name in reply}


def _wait_nodes(app: object, count: int, timeout: float = 90) -> set[str]:
    deadline = time.monotonic() + timeout
    nodes: set[str] = set()
    while time.monotonic() < deadline:
        nodes = _nodes(app)
        if len(nodes) == count:
            return nodes
        time.sleep(0.5)
    raise AssertionError(f"expected {count} workers, saw {nodes}")


def test_cpu_workers_are_supervised_and_stop_on_sigterm(
    redis_url: str, tmp_path: Path, own_host: str
) -> None:
    redis.Redis.from_url(redis_url).flushdb()
    env = {**os.environ, "FRAMEFLEET_BROKER_URL": redis_url, "FRAMEFLEET_RESULT_BACKEND": redis_url,
           "FRAMEFLEET_METRICS_PORT": "0", "PYTHONUNBUFFERED": "1"}
    log = (tmp_path / "launcher.log").open("wb")
    launcher = subprocess.Popen(_launcher_argv(2, own_host),
                                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    app = make_app(redis_url, redis_url)
    try:
        # Given the launcher with two CPU workers
        nodes = _wait_nodes(app, 2)
        assert nodes == {f"cpu0@{own_host}", f"cpu1@{own_host}"}
        # When one worker process dies
        out = subprocess.run(["pgrep", "-f", "-n", "-P", str(launcher.pid), f"cpu1@{own_host}"],
                             capture_output=True, text=True, timeout=10)
        pid = int(out.stdout.split()[0])
        os.kill(pid, signal.SIGKILL)
        # Then the launcher starts it again (after its back-off) and both answer
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            again = subprocess.run(["pgrep", "-f", "-P", str(launcher.pid), f"cpu1@{own_host}"],
                                   capture_output=True, text=True, timeout=10).stdout.split()
            if again and int(again[0]) != pid:
                break
            time.sleep(0.5)
        else:
            raise AssertionError("cpu1 was not restarted")
        _wait_nodes(app, 2)
        # And SIGTERM to the launcher stops every worker (warm shutdown) and the launcher
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=60) == 0
        assert _nodes(app, timeout=1.0) == set()
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait(timeout=10)
        log.close()


def test_the_drain_wait_follows_the_longest_job() -> None:
    # The hard time limit comes 60 s after the soft one; then storing the result and the ack
    assert drain_timeout_s(Settings(max_time_limit_s=3600)) == 3600 + 60 + 30
    assert drain_timeout_s(Settings()) == Settings().max_time_limit_s + 90
    assert drain_timeout_s(Settings(max_time_limit_s=3600, hard_limit_after_s=5)) == 3600 + 35


def test_a_stopped_launcher_kills_what_outlives_the_drain_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given workers that ignore SIGTERM (a job that runs on), and a drain wait of 1 s
    def stubborn(name: str) -> list[str]:
        ready = tmp_path / name
        return [sys.executable, "-c",
                "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "open(sys.argv[1], 'w').close(); time.sleep(60)", str(ready)]

    monkeypatch.setattr(launcher_module, "worker_command", stubborn)
    launcher = Launcher([WorkerSlot("a@h", {}), WorkerSlot("b@h", {})], drain_s=1.0)
    done = threading.Thread(target=launcher.run, kwargs={"poll_s": 0.05})
    done.start()
    deadline = time.monotonic() + 30
    while not all((tmp_path / n).exists() for n in ("a@h", "b@h")):
        assert time.monotonic() < deadline, "the workers did not start"
        time.sleep(0.05)
    # When it is stopped
    t0 = time.monotonic()
    launcher.stop()
    done.join(timeout=20)
    # Then it waited about 1 s for both together, then killed them
    assert not done.is_alive()
    assert time.monotonic() - t0 < 5
    assert [s.proc.returncode for s in launcher.slots if s.proc] == [-signal.SIGKILL] * 2


def test_a_gpu_another_launcher_runs_is_refused(own_host: str) -> None:
    host = own_host
    held = HostNames()
    try:
        # Given another launcher on this host that runs GPU 0 (it holds the node name)
        assert held.take(f"gpu0@{host}")
        # Then a launcher for GPU 0 refuses to start, saying why
        with pytest.raises(ValueError, match=rf"gpu0@{host} is already run by another"):
            plan_for([0], 0, Settings(), HostNames())
    finally:
        held.close()


def test_cpu_workers_take_names_no_other_launcher_holds(own_host: str) -> None:
    host = own_host
    first, second = HostNames(), HostNames()
    try:
        # Given a launcher with two CPU workers on this host
        a = plan_for([], 2, Settings(metrics_port=9400), first)
        # When a second one plans two more
        b = plan_for([], 2, Settings(metrics_port=9400), second)
        # Then all four names and metrics ports differ, and each follows its index
        names = [s.name for s in a + b]
        assert len(set(names)) == 4 and all(n.endswith(f"@{host}") for n in names)
        for slot in a + b:
            j = int(slot.name.split("@")[0].removeprefix("cpu"))
            assert slot.env["FRAMEFLEET_METRICS_PORT"] == str(9400 + 100 + j)
            assert slot.pass_fds  # the worker inherits its name's reservation
        # and a name is free again once its holder has gone
        first.close()
        third = HostNames()
        assert {s.name for s in plan_for([], 2, Settings(), third)} == {s.name for s in a}
        third.close()
    finally:
        first.close()
        second.close()


def test_a_taken_metrics_port_is_a_startup_error() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        slot = WorkerSlot("cpu0@h", {"FRAMEFLEET_METRICS_PORT": str(port)})
        with pytest.raises(ValueError, match=rf"FRAMEFLEET_METRICS_PORT: port {port} of cpu0@h"):
            check_metrics_ports([slot])
    check_metrics_ports([slot, WorkerSlot("cpu1@h", {"FRAMEFLEET_METRICS_PORT": "0"})])


def _metrics_base() -> int:
    """A base port whose CPU slots 0-3 (base + 100 + j) are free on loopback now."""
    for _ in range(100):
        base = free_port() - 100
        try:
            for j in range(4):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", base + 100 + j))
        except OSError:
            continue
        return base
    raise AssertionError("no free metrics ports")


def _scrape(port: int, timeout: float = 60) -> bytes:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
                return bytes(resp.read())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_two_launchers_on_one_host_get_distinct_names_and_metrics_ports(
    redis_url: str, tmp_path: Path, own_host: str
) -> None:
    redis.Redis.from_url(redis_url).flushdb()
    base = _metrics_base()
    env = {**os.environ, "FRAMEFLEET_BROKER_URL": redis_url, "FRAMEFLEET_RESULT_BACKEND": redis_url,
           "FRAMEFLEET_METRICS_PORT": str(base), "PYTHONUNBUFFERED": "1"}
    app = make_app(redis_url, redis_url)
    launchers: list[subprocess.Popen[bytes]] = []
    logs = [(tmp_path / f"launcher-{n}.log").open("wb") for n in (1, 2)]
    try:
        # Given a launcher of one CPU worker
        # When a second launcher of one CPU worker starts on the same host
        for n, log in enumerate(logs, start=1):
            launchers.append(subprocess.Popen(
                _launcher_argv(1, own_host), cwd=ROOT,
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
            nodes = _wait_nodes(app, n)
        # Then both workers answer, under two names, each with its own /metrics port
        assert nodes == {f"cpu0@{own_host}", f"cpu1@{own_host}"}, nodes
        for node in nodes:
            j = int(node.split("@")[0].removeprefix("cpu"))
            assert b"framefleet_" in _scrape(base + 100 + j), node
        for launcher in launchers:
            launcher.send_signal(signal.SIGTERM)
        assert [launcher.wait(timeout=60) for launcher in launchers] == [0, 0]
    finally:
        for launcher in launchers:
            if launcher.poll() is None:
                os.killpg(launcher.pid, signal.SIGKILL)
                launcher.wait(timeout=10)
        for log in logs:
            log.close()
