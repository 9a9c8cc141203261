"""A docker engine for the docker test: the one running, or a ``dockerd`` this test starts.

CI starts none: the test starts Debian's ``dockerd`` (as root), waits for its API and, at the
end, stops the one it started, by PID, and nothing else. Without docker.io (or root to start
it) the test skips, naming the package; with ``CI=true`` it fails instead.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.require import missing

DOCKER_IO = "the docker.io package (apt-get install docker.io), as root"
#: dockerd stops the containers still running before it exits; their own stop grace applies.
STOP_TIMEOUT_S = 90


def docker_cli() -> str:
    """The docker client on PATH, or skip/fail naming the package."""
    found = shutil.which("docker")
    if found is None:
        missing("executable 'docker'", DOCKER_IO)
    assert found is not None
    return found


def engine_answers(docker: str) -> bool:
    """Whether a docker engine answers this client (``docker info``)."""
    try:
        done = subprocess.run([docker, "info", "--format", "{{.ServerVersion}}"],
                              capture_output=True, text=True, timeout=30, check=False)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0 and bool(done.stdout.strip())


@contextmanager
def docker_engine(workdir: Path, ready_timeout_s: float = 60.0) -> Iterator[str]:
    """Yield the docker client once an engine answers; start ``dockerd`` if none runs, and
    stop that one (SIGTERM, by PID; SIGKILL after ``STOP_TIMEOUT_S``) when done."""
    docker = docker_cli()
    if engine_answers(docker):
        yield docker
        return
    dockerd = shutil.which("dockerd") or shutil.which("dockerd", path="/usr/sbin:/sbin")
    if dockerd is None:
        missing("executable 'dockerd'", DOCKER_IO)
    if os.geteuid() != 0:
        missing("a running docker engine", DOCKER_IO + " (this test starts dockerd only as root)")
    assert dockerd is not None
    log = workdir / "dockerd.log"
    with log.open("wb") as out:
        # Its own session, so that a Ctrl-C meant for pytest does not reach it half-way.
        proc = subprocess.Popen([dockerd], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + ready_timeout_s
        while not engine_answers(docker):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-3000:]
                raise AssertionError(f"dockerd did not come up (exit {proc.poll()}):\n{tail}")
            time.sleep(0.5)
        yield docker
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the dockerd this test started; SIGKILL it if it has not exited in time."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)
