"""The Flower dashboard on a real fleet: a worker, jobs that succeed and fail, a browser.

One Celery worker runs pattern jobs from the test Redis while a real Flower process (started
through ``framefleet flower``) watches the events; Flower's API must list every job with its
final state, and headless Chromium must render the tasks page with those jobs in it.

Flower knows only the tasks whose events it received while running, so it starts before any
job is submitted and the test waits until it has heard from the worker: task-sent events come
from the client (``task_send_sent_event``), the others from the worker (``-E``).

A second test starts Flower where the worker-only packages (torch, av, ...) cannot be
imported, as in the producer image that runs the dashboard.
"""

from __future__ import annotations

import json
import os
import secrets
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis

from producer.app import TASK_NAME
from producer.client import Client
from producer.errors import JobFailed
from tests.e2e.helpers import pattern_spec, put_latents
from tests.require import require_binary
from tests.services import (
    REPO_ROOT,
    S3Server,
    WorkerFactory,
    _Process,
    free_port,
)

pytestmark = pytest.mark.e2e

CHROMIUM_INSTALL = "Debian package chromium"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
WINDOW = (1400, 900)
# Chromium flags for a quiet, offline, throwaway browser: no sandbox (containers lack the
# namespaces), no GPU, nothing fetched from Google, no first-run UI.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    f"--window-size={WINDOW[0]},{WINDOW[1]}",
    # The tasks table is filled by JavaScript (DataTables, one XHR): let virtual time run
    # long enough for it before the screenshot or DOM dump is taken.
    "--virtual-time-budget=5000",
)

T = TypeVar("T")


def wait_for(
    probe: Callable[[], T | None], timeout: float, what: str, log: Callable[[], str] = str
) -> T:
    """Poll ``probe()`` until it returns something other than None; fail after ``timeout`` s
    with the tail of ``log()`` in the message."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout:.0f} s; log:\n{log()[-3000:]}")
        time.sleep(0.2)


class FlowerProcess(_Process):
    """``framefleet flower`` on a loopback port, watching the fleet's broker.

    The CLI passes its extra arguments to ``celery -A producer.ops.dashboard flower`` and
    execs it, so the PID is Flower's own. ``FLOWER_UNAUTHENTICATED_API`` opens ``/api/*``
    without a login: tests only, never a deployment.
    """

    def __init__(
        self, workdir: Path, broker_url: str, env: Mapping[str, str] | None = None
    ) -> None:
        super().__init__("flower", workdir / "flower.log")
        self.workdir = workdir
        self.port = free_port()
        self.env = {
            **os.environ,
            "FRAMEFLEET_BROKER_URL": broker_url,
            "FRAMEFLEET_RESULT_BACKEND": broker_url,
            "FLOWER_UNAUTHENTICATED_API": "true",
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        """The command line: the framefleet CLI, with Flower's own options passed through."""
        return [
            sys.executable, "-m", "producer.cli", "flower",
            "--address=127.0.0.1", f"--port={self.port}",
        ]  # fmt: skip

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
        """GET ``path``; (status, body), or (0, b"") when nothing answers yet."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as response:
                return int(response.status), response.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except OSError:
            return 0, b""

    def get_json(self, path: str) -> Any:
        """GET ``path`` and decode its JSON body; fails the test on a non-200 answer."""
        status, body = self.get(path)
        assert status == 200, f"GET {path}: HTTP {status}: {body[:500]!r}"
        return json.loads(body)

    def _answers(self) -> bool:
        # Connected to the broker too: before that, events sent now would be missed.
        return self.get("/")[0] == 200 and "Connected to redis" in self.log_text()

    def start(self) -> None:
        """Spawn Flower; call ``wait_ready()`` before relying on it."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        # Run from the repository, as the workers do: ``-A producer.ops.dashboard`` imports
        # from there.
        self._spawn(self.argv(), self.env, REPO_ROOT)

    def wait_ready(self, timeout: float = 60.0) -> float:
        """Wait until the dashboard answers and Flower is on the broker; return the seconds."""
        return self._wait_until(self._answers, timeout, "dashboard answer", 0.2)


@pytest.fixture
def flower(redis_url: str, tmp_path: Path) -> Iterator[FlowerProcess]:
    """A Flower process on the test Redis, not yet started; stopped (SIGTERM, then SIGKILL of
    its process group) by PID afterwards."""
    server = FlowerProcess(tmp_path / "flower", redis_url)
    try:
        yield server
    finally:
        server.stop()


def chromium(binary: str, profile: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    """Run headless Chromium once with its own throwaway profile; bounded in time."""
    profile.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        timeout=90,
        check=False,
        cwd=profile,
    )


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk (the first chunk, right after the signature)."""
    assert data[:8] == PNG_SIGNATURE, f"not a PNG: {data[:16]!r}"
    assert data[12:16] == b"IHDR", f"PNG without IHDR first: {data[8:32]!r}"
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


@pytest.fixture(scope="session")
def browser() -> str:
    """The chromium executable; session-scoped so a missing one skips before servers start."""
    return require_binary("chromium", CHROMIUM_INSTALL)


def test_flower_shows_fleet_jobs(
    browser: str,
    redis_url: str,
    worker_factory: WorkerFactory,
    flower: FlowerProcess,
    s3: S3Server,
    s3_bucket: str,
    tmp_path: Path,
) -> None:
    """Flower's API and its tasks page, seen by a browser, show succeeded and failed jobs."""
    # No job of an earlier test may be left queued for this worker.
    redis.Redis.from_url(redis_url).flushdb()
    client = Client(broker_url=redis_url, backend_url=redis_url)
    run = secrets.token_hex(3)
    good = [
        pattern_spec(
            f"flower-ok{i}-{run}",
            put_latents(s3, s3_bucket, f"in/f{i}.npy", 2 + i, fmt="npy"),
            s3_bucket,
            tenant="dash",
        )
        for i in range(3)
    ]
    bad = pattern_spec(
        f"flower-bad-{run}", f"s3://{s3_bucket}/in/missing.npy", s3_bucket, tenant="dash"
    )

    # Given Flower watching the broker (started first: it only knows events it received) and
    # one worker with events on; the two boot side by side.
    flower.start()
    (worker,) = worker_factory(1, env={"FRAMEFLEET_METRICS_PORT": "0"})
    flower.wait_ready()

    # and Flower has heard the worker (heartbeats are events): the event stream is live.
    def worker_seen() -> bool | None:
        # /workers?json=1 is Flower's event state, not a broadcast inspect: only events fill it.
        seen = flower.get_json("/workers?json=1")["data"]
        return True if any(w.get("hostname") == worker.nodename for w in seen) else None

    wait_for(worker_seen, 30, f"worker {worker.nodename} in Flower's event state", flower.log_text)

    # When three jobs succeed and one fails (its input does not exist)
    handles = [client.submit(spec) for spec in [*good, bad]]
    for handle in handles[:-1]:
        handle.wait(timeout=120)
    with pytest.raises(JobFailed, match="missing.npy"):
        handles[-1].wait(timeout=120)

    # Then Flower's API lists every job under the task name, with its final state
    # (Flower names a task by its id: the job's key, tenant:job_id)
    expected = {spec.key: "SUCCESS" for spec in good} | {bad.key: "FAILURE"}

    def all_final() -> dict[str, Any] | None:
        # Events arrive after the results; only this test's jobs count (the Redis is shared).
        tasks: dict[str, Any] = flower.get_json("/api/tasks")
        ours = {uuid: task for uuid, task in tasks.items() if uuid in expected}
        states = {uuid: task.get("state") for uuid, task in ours.items()}
        return ours if states == expected else None

    tasks = wait_for(
        all_final, 30, f"final states {expected} in Flower's /api/tasks", flower.log_text
    )
    assert {task["name"] for task in tasks.values()} == {TASK_NAME}
    assert {task["worker"] for task in tasks.values()} == {worker.nodename}
    assert "missing.npy" in tasks[bad.key]["exception"]

    # and headless Chromium renders the tasks page with those jobs in it.
    shot = tmp_path / "tasks.png"
    took = chromium(
        browser, tmp_path / "chromium-shot", f"--screenshot={shot}", f"{flower.url}/tasks"
    )
    assert took.returncode == 0, took.stderr.decode(errors="replace")[-3000:]
    data = shot.read_bytes()
    assert png_size(data) == WINDOW
    # A blank 1400x900 PNG compresses to a few kB; a page of text and table rows does not.
    assert len(data) > 20_000, f"screenshot of only {len(data)} bytes"
    dumped = chromium(browser, tmp_path / "chromium-dom", "--dump-dom", f"{flower.url}/tasks")
    assert dumped.returncode == 0, dumped.stderr.decode(errors="replace")[-3000:]
    dom = dumped.stdout.decode(errors="replace")
    for text in (TASK_NAME, "SUCCESS", "FAILURE", *expected):
        assert text in dom, f"{text!r} not in the rendered tasks page"


# Modules that only the [worker] extra installs: the producer image (docker/Dockerfile.producer,
# which runs the compose file's flower service) has none of them.
WORKER_ONLY_MODULES = ("torch", "av", "diffusers", "safetensors", "pynvml")


def test_flower_starts_without_worker_code(redis_url: str, tmp_path: Path) -> None:
    """The dashboard runs without the [worker] extra (the producer image has none of it)."""
    # Given an interpreter where the worker-only packages cannot be imported, as in the
    # producer image: a sitecustomize (it survives the CLI's exec) blocks them.
    blocker = tmp_path / "no-worker-extras"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        f"import sys\nfor name in {WORKER_ONLY_MODULES!r}:\n    sys.modules[name] = None\n"
    )
    path = os.pathsep.join(p for p in (str(blocker), os.environ.get("PYTHONPATH")) if p)
    server = FlowerProcess(tmp_path / "flower", redis_url, env={"PYTHONPATH": path})
    try:
        # When `framefleet flower` starts there
        server.start()
        # Then the dashboard answers: it needs no worker code, the events name the tasks.
        server.wait_ready(60)
    finally:
        server.stop()
