"""A "host" for chaos tests: ``python -m worker --cpu 1`` (what ``framefleet worker`` runs: the
launcher and its Celery worker) in a process group of its own, under a host name of its own.

Each launcher believes it runs on its own machine: ``socket.gethostname`` answers the name
given here, so its worker is ``cpu0@<name>``. SIGKILL to the group is a host that loses power:
launcher, Celery main process and pool process die together, nobody acknowledges, rejects or
restores anything.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from pathlib import Path

import psutil

from tests.services import REPO_ROOT, _Process

# The worker's entry point with gethostname() answering the first argument (the launcher names
# its workers in this process; ``framefleet worker`` would exec a new one, without the patch).
_SHIM = ("import socket, sys; name = sys.argv.pop(1); socket.gethostname = lambda: name; "
         "from worker.__main__ import main; sys.exit(main(sys.argv[1:]))")


class Host(_Process):
    """One launcher of ``cpus`` CPU workers (``cpu0@<name>``, ``cpu1@<name>``…);
    ``nodename`` is the first's; the log holds them all."""

    def __init__(self, name: str, logdir: Path, env: Mapping[str, str], cpus: int = 1) -> None:
        super().__init__(f"host {name}", logdir / f"{name}.log")
        self.host = name
        self.nodename = f"cpu0@{name}"
        self.nodenames = [f"cpu{j}@{name}" for j in range(cpus)]
        self.env = dict(env)
        self.cpus = cpus

    def start(self) -> None:
        env = {**self.env, "PYTHONUNBUFFERED": "1"}
        self._spawn([sys.executable, "-c", _SHIM, self.host, "--cpu", str(self.cpus)], env,
                    REPO_ROOT)

    def main_process(self) -> psutil.Process:
        """The Celery worker's main process (the launcher's one child; the pool is its child):
        it touches the messages the host holds."""
        (main,) = psutil.Process(self.pid).children()
        return main

    def wait_ready(self, timeout: float = 90.0) -> float:
        patterns = [rf"(?m)\b{re.escape(n)} ready\.$" for n in self.nodenames]
        return self._wait_until(
            lambda: all(re.search(p, self.log_text()) is not None for p in patterns),
            timeout, "'ready.' line", 0.1)
