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
    """One launcher of one CPU worker; ``nodename`` is ``cpu0@<name>``; the log holds both."""

    def __init__(self, name: str, logdir: Path, env: Mapping[str, str]) -> None:
        super().__init__(f"host {name}", logdir / f"{name}.log")
        self.host = name
        self.nodename = f"cpu0@{name}"
        self.env = dict(env)

    def start(self) -> None:
        env = {**self.env, "PYTHONUNBUFFERED": "1"}
        self._spawn([sys.executable, "-c", _SHIM, self.host, "--cpu", "1"], env,
                    REPO_ROOT)

    def main_process(self) -> psutil.Process:
        """The Celery worker's main process (the launcher's one child; the pool is its child):
        it touches the messages the host holds."""
        (main,) = psutil.Process(self.pid).children()
        return main

    def wait_ready(self, timeout: float = 90.0) -> float:
        pattern = rf"(?m)\b{re.escape(self.nodename)} ready\.$"
        return self._wait_until(lambda: re.search(pattern, self.log_text()) is not None,
                                timeout, "'ready.' line", 0.1)
