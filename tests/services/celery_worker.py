"""Celery worker processes (``producer.app.worker_command``), started and killed by PID."""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from producer.app import QUEUE, WORKER_APP
from producer.state.keys import UNACKED
from tests.services.base import REPO_ROOT, _Process


class WorkerProcess(_Process):
    """A real ``celery -A worker.lifecycle.main worker`` subprocess consuming the ``video`` queue.

    Runs from the repository root with ``os.environ`` plus ``env``; stdout and stderr go to
    ``<logdir>/<name>.log``. The nodename is ``<name>@<host>``. ``FRAMEFLEET_TEST_APP`` in
    ``env`` names another app module (a test's worker, such as ``tests.e2e.paced_worker``).
    """

    # Celery's warm shutdown: SIGTERM to the main process only, which lets the running job
    # finish and stops its pool child itself; a pool child that gets SIGTERM too dies
    # mid-job and the job is re-delivered. stop() still SIGKILLs the group after its timeout.
    term_group = False

    def __init__(
        self, name: str, logdir: Path, env: Mapping[str, str] | None = None, queue: str = QUEUE
    ) -> None:
        super().__init__(f"celery worker {name}", logdir / f"{name}.log")
        self.worker_name = name
        self.env = dict(env or {})
        self.queue = queue
        self.nodename: str | None = None

    def argv(self) -> list[str]:
        """The command line."""
        return [
            sys.executable, "-m", "celery", "-A", self.env.get("FRAMEFLEET_TEST_APP", WORKER_APP),
            "worker",
            "-Q", self.queue,
            "-c", "1",
            "--prefetch-multiplier", "1",
            "-n", f"{self.worker_name}@%h",
            "-E",
            "--without-gossip",
            "--without-mingle",
            "-l", "INFO",
        ]  # fmt: skip

    def start(self) -> None:
        """Spawn the worker; call ``wait_ready()`` before sending it work."""
        env = {**os.environ, **self.env}
        # Unbuffered: the log must show "ready." (and a crash's last words) when they happen.
        env["PYTHONUNBUFFERED"] = "1"
        self._spawn(self.argv(), env, REPO_ROOT)

    def _ready_line(self) -> bool:
        # Celery logs "<nodename> ready." once its consumer is attached to the broker.
        pattern = rf"(?m)\b({re.escape(self.worker_name)}@\S+) ready\.$"
        match = re.search(pattern, self.log_text())
        if match:
            self.nodename = match.group(1)
        return match is not None

    def wait_ready(self, timeout: float = 60.0) -> float:
        """Wait until the worker logs that it is ready; return the seconds waited."""
        return self._wait_until(self._ready_line, timeout, "'ready.' line", 0.1)


class WorkerFactory(Protocol):
    """The ``worker_factory`` fixture: start ``n`` ready workers, stopped after the test."""

    def __call__(
        self, n: int = 1, env: Mapping[str, str] | None = None, ready_timeout: float = 60.0
    ) -> list[WorkerProcess]: ...


def stop_workers(workers: Sequence[WorkerProcess], timeout: float = 10.0) -> str:
    """End a test's workers once the test is over; returns how (``"killed"``, ``"warm"``).
    ``timeout``: how long a warm shutdown may take before the group is SIGKILLed.

    Idle workers are SIGKILLed at once: a Celery warm shutdown with nothing to finish still
    spends about 2.5 s in Celery's own waits (its event loop's 1 s poll, the pool's join, its
    result handler), and a suite stops some 50 workers. Idle means: with every worker frozen
    (SIGSTOP), the broker holds no message delivered to a worker and not acknowledged
    (kombu's ``unacked`` hash, which with ``acks_late`` also holds every running job). A
    frozen worker cannot take one after that look; a message Redis handed it in the meantime
    dies with it, unacknowledged nowhere, so it is never sent again into a later test.
    Anything else (a job still running, a broker the test stopped, not Redis) gets the warm
    shutdown, side by side, which lets a running job end.
    """
    alive = [w for w in workers if w.running]
    for worker in alive:
        worker.pause()
    brokers = {w.env.get("FRAMEFLEET_BROKER_URL", "") for w in alive}
    how = "killed" if alive and all(_nothing_unacked(url) for url in brokers) else "warm"
    if how == "killed":
        for worker in alive:
            worker.kill()
    for worker in alive:  # SIGCONT first: a frozen worker would never act on SIGTERM
        worker.terminate()
    for worker in workers:
        worker.stop(timeout)
    return how


def _nothing_unacked(url: str) -> bool:
    """True if the Redis broker at ``url`` answers at once and holds no unacked message."""
    import redis

    if not url.startswith(("redis://", "rediss://", "unix://")):
        return False
    with contextlib.suppress(redis.RedisError, ValueError):
        client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        try:
            return int(client.hlen(UNACKED)) == 0
        finally:
            client.close()
    return False
