"""The launcher: GPU selection, pinning, and supervising real worker processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from producer.app import make_app
from producer.settings import Settings
from worker.launcher import parse_gpus, plan_for, plan_workers

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("value", "available", "expected"),
    [("all", 4, [0, 1, 2, 3]), ("2", 4, [0, 1]), ("0", 2, [0]), ("0,2", 4, [0, 2]),
     ("1,0", 2, [1, 0])],
)
def test_parse_gpus(value: str, available: int, expected: list[int]) -> None:
    assert parse_gpus(value, available) == expected


@pytest.mark.parametrize(("value", "available"), [("5", 4), ("0,0", 2), ("3", 2), ("0,7", 4)])
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


def test_cpu_workers_are_supervised_and_stop_on_sigterm(redis_url: str, tmp_path: Path) -> None:
    redis.Redis.from_url(redis_url).flushdb()
    env = {**os.environ, "FRAMEFLEET_BROKER_URL": redis_url, "FRAMEFLEET_RESULT_BACKEND": redis_url,
           "FRAMEFLEET_METRICS_PORT": "0", "PYTHONUNBUFFERED": "1"}
    log = (tmp_path / "launcher.log").open("wb")
    launcher = subprocess.Popen([sys.executable, "-m", "producer.cli", "worker", "--cpu", "2"],
                                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    app = make_app(redis_url, redis_url)
    try:
        # Given the launcher with two CPU workers
        nodes = _wait_nodes(app, 2)
        assert {n.split("@")[0] for n in nodes} == {"cpu0", "cpu1"}
        # When one worker process dies
        out = subprocess.run(["pgrep", "-f", "-n", "-P", str(launcher.pid), "cpu1@"],
                             capture_output=True, text=True, timeout=10)
        pid = int(out.stdout.split()[0])
        os.kill(pid, signal.SIGKILL)
        # Then the launcher starts it again (after its back-off) and both answer
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            again = subprocess.run(["pgrep", "-f", "-P", str(launcher.pid), "cpu1@"],
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
