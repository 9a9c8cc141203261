"""The shape every throwaway server shares: a process group of its own, a log, bounded waits,
free loopback ports."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
LOG_TAIL_CHARS = 4000

#: What to install when a binary is missing (the message of ``require_binary``).


class ServiceError(RuntimeError):
    """A throwaway server did not start, or died, within its time limit."""


#: Every port this process has handed out: never handed out again. The kernel picks an
#: ephemeral port that is free *now*; two servers that each asked for one before either bound
#: it could be given the same port (a replica once got its primary's: "bind: Address already in
#: use"). Guarded by a lock: fixtures may start servers from threads.
_HANDED_OUT: set[int] = set()
_HANDED_OUT_LOCK = threading.Lock()


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now (the kernel picks it), and that no
    other call in this process has returned."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports, none handed out before by this process.

    All sockets stay open until every port is picked, so the kernel cannot hand out the same
    port twice in one call, and the process-wide record keeps later calls off these ports
    (servers started one after the other, each asking for its own port, cannot collide).
    Another process may still take one before the server binds it; the servers' readiness
    checks then time out with a clear error rather than talk to a stranger.
    """
    with _HANDED_OUT_LOCK, contextlib.ExitStack() as stack:
        ports: list[int] = []
        for _ in range(count * 50):
            if len(ports) == count:
                break
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
            if port not in _HANDED_OUT:  # the socket stays open: the kernel picks another
                ports.append(port)
        if len(ports) < count:
            raise ServiceError(f"no {count} fresh loopback ports")
        _HANDED_OUT.update(ports)
        return ports


def free_port_pair(offset: int, avoid: Sequence[int] = ()) -> int:
    """A free loopback port ``p`` such that ``p + offset`` is free too (neither in ``avoid``)."""
    for _ in range(200):
        port = free_port()
        pair = port + offset
        if port in avoid or pair in avoid or pair > 65535:
            continue
        with _HANDED_OUT_LOCK:
            if pair in _HANDED_OUT:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind(("127.0.0.1", pair))
                except OSError:
                    continue
            _HANDED_OUT.add(pair)
        return port
    raise ServiceError(f"no free loopback port pair {offset} apart")


# Loaded here, not in the forked child: the child of a threaded parent should do as little
# as possible before exec.
_LIBC = ctypes.CDLL(None) if sys.platform == "linux" else None
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: get SIGKILL when the parent dies (Linux only).

    The signal fires when the *thread* that started the child exits, so start servers from
    the main thread (pytest fixtures do).
    """
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class _Process:
    """One subprocess in its own process group, with stdout and stderr in one log file."""

    #: Whether ``stop()`` sends SIGTERM to the whole group or only to the main process.
    term_group = True

    def __init__(self, name: str, log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self._terminating = False

    def _spawn(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> None:
        if self.running:
            raise ServiceError(f"{self.name} is already running")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._terminating = False
        # Append: a restarted server keeps the earlier run's log for post-mortems.
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                # Unsafe only if the child ran Python code needing a lock another thread
                # held at fork; _die_with_parent makes one libc call.
                preexec_fn=_die_with_parent,
            )

    @property
    def pid(self) -> int:
        """PID of the process (also its process group id)."""
        if self.proc is None:
            raise ServiceError(f"{self.name} was never started")
        return self.proc.pid

    @property
    def running(self) -> bool:
        """True while the process exists (a paused process is still running)."""
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        """Everything the process wrote so far (all runs, if restarted)."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _failure(self, problem: str) -> ServiceError:
        tail = self.log_text()[-LOG_TAIL_CHARS:]
        return ServiceError(f"{self.name}: {problem}; log {self.log_path}:\n{tail}")

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the process group; a group that is already gone is fine."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def terminate(self) -> None:
        """Send SIGTERM once, without waiting: ``stop()`` several processes in parallel."""
        if self.proc is None or self.proc.poll() is not None or self._terminating:
            return
        self._terminating = True
        # A SIGSTOPped process would never act on SIGTERM.
        self.signal_group(signal.SIGCONT)
        if self.term_group:
            self.signal_group(signal.SIGTERM)
        else:
            os.kill(self.proc.pid, signal.SIGTERM)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, wait ``timeout`` s, then SIGKILL the group; reap the process."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.signal_group(signal.SIGKILL)
                self.proc.wait(timeout)
        # Children that ignored SIGTERM (pool workers) must not outlive their parent.
        self.signal_group(signal.SIGKILL)
        self._wait_group_gone(timeout)

    def _wait_group_gone(self, timeout: float) -> None:
        """Wait until no process of the group is left: SIGKILL is delivered asynchronously,
        and a killed child lingers until it is reaped."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.02)

    def kill(self, sig: int = signal.SIGKILL, *, group: bool = True, timeout: float = 10.0) -> None:
        """Send ``sig`` (default SIGKILL: a crash); after SIGKILL, reap the process.

        ``group=False`` signals only the main PID, e.g. SIGTERM to a Celery worker's parent
        for a warm shutdown, or SIGKILL to it alone to orphan its pool child.
        """
        if self.proc is None:
            return
        if group:
            self.signal_group(sig)
        elif self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
        if sig == signal.SIGKILL:
            self.proc.wait(timeout)

    def pause(self) -> None:
        """SIGSTOP the group: connections hang instead of being refused."""
        self.signal_group(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT the group after ``pause()``."""
        self.signal_group(signal.SIGCONT)

    def _wait_until(
        self, ready: Callable[[], bool], timeout: float, what: str, interval: float = 0.05
    ) -> float:
        """Poll ``ready()`` until true; return seconds waited. Fails fast if the process died."""
        start = time.monotonic()
        deadline = start + timeout
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise self._failure(f"exited with {self.proc.returncode} before {what}")
            if ready():
                return time.monotonic() - start
            if time.monotonic() > deadline:
                raise self._failure(f"no {what} within {timeout:.0f} s")
            time.sleep(interval)
