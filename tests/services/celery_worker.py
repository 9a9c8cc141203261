"""Celery worker processes (``producer.app.worker_command``), started and killed by PID."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from producer.app import QUEUE, WORKER_APP
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
