"""One Celery worker process per GPU, pinned with CUDA_VISIBLE_DEVICES, supervised.

The launcher itself never initialises CUDA (GPUs are counted through NVML or ``nvidia-smi``):
CUDA is initialised only in the worker's pool process that runs tasks. A worker that dies is
restarted with exponential back-off, unless it exits with ``CONFIG_EXIT`` (a configuration
that cannot work): then the launcher stops its workers and exits with that status. SIGTERM
and SIGINT are forwarded for a warm shutdown (the running job finishes; with acks_late an
unfinished job is redelivered). The launcher waits for
that as long as the longest job may run (``drain_timeout_s``), then kills what is left.

Node names are unique on a host: each launcher reserves the names of its workers
(``HostNames``), so a second launcher of ``--cpu 1`` on the same host runs ``cpu1@host``
(and serves /metrics on the port of CPU slot 1), and one for a GPU that another launcher
already runs refuses to start. A metrics port something else holds is a startup error too.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from producer.app import worker_command
from producer.errors import SettingsError
from producer.ports import metrics_port_for
from producer.settings import Settings
from producer.settings.urls import mask
from producer.state.broker import auth_problem

log = logging.getLogger(__name__)
#: The decoder a GPU worker warms up when ``FRAMEFLEET_WARMUP_DECODER`` is unset.
GPU_WARMUP_DECODER = "wan2.1-vae"
#: After a job's hard time limit: 30 s to store the result and ack.
ACK_MARGIN_S = 30
#: CPU slot indices a launcher tries before it gives up finding a free node name.
MAX_CPU_INDEX = 1000
#: The exit status of a worker whose configuration cannot work (bad URL, refused password;
#: sysexits' EX_CONFIG): the launcher stops instead of restarting it, and exits with it too.
CONFIG_EXIT = 78


def drain_timeout_s(settings: Settings) -> float:
    """Seconds a stopping launcher lets its workers finish their running jobs before it kills
    them: the longest job's hard limit (``FRAMEFLEET_MAX_TIME_LIMIT_S`` +
    ``FRAMEFLEET_HARD_LIMIT_AFTER_S``) plus the ack's margin. The platform's grace period
    (compose ``stop_grace_period``, Kubernetes ``terminationGracePeriodSeconds``, the ASG drain
    timeout) should be at least this."""
    return float(settings.max_time_limit_s + settings.hard_limit_after_s + ACK_MARGIN_S)


class HostNames:
    """Worker node names reserved on this host while the launcher (or the worker) lives.

    One abstract Unix socket per name (Linux): binding a name another process holds fails,
    and the kernel frees it when the holder dies, however it dies (no stale lock files). The
    abstract namespace is per network namespace, the same scope in which two workers' metrics
    ports would clash. Elsewhere (macOS) nothing is reserved.
    """

    def __init__(self) -> None:
        self._held: dict[str, socket.socket] = {}

    def take(self, name: str) -> bool:
        """Reserve ``name``; False if another process holds it."""
        if not sys.platform.startswith("linux"):
            return True
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(f"\0framefleet-node:{name}")
        except OSError as e:
            sock.close()
            if e.errno == errno.EADDRINUSE:
                return False
            raise
        self._held[name] = sock
        return True

    def fds(self, name: str) -> tuple[int, ...]:
        """The descriptor that holds ``name``, for the worker to inherit (it keeps the name
        reserved should the launcher die before it)."""
        sock = self._held.get(name)
        return () if sock is None else (sock.fileno(),)

    def close(self) -> None:
        for sock in self._held.values():
            sock.close()
        self._held.clear()


def count_gpus() -> int:
    """GPUs on this host without touching CUDA: NVML first, then ``nvidia-smi -L``."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no driver / no library: try the CLI
        pass
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def parse_gpus(value: str, available: int) -> list[int]:
    """``all`` | ``N`` (the first N) | ``0,2`` (those indices)."""
    value = value.strip()
    if value == "all":
        return list(range(available))
    if "," not in value and value.isdigit() and int(value) > 0 and value != "0":
        n = int(value)
        if n > available:
            raise ValueError(f"--gpus {n}: only {available} GPU(s) on this host")
        return list(range(n))
    parts = [v.strip() for v in value.split(",") if v.strip()]
    if not parts or not all(v.isdigit() for v in parts):
        raise ValueError(f"--gpus {value!r}: expected all, a count (2) or GPU indices (0,2)")
    indices = [int(v) for v in parts]
    bad = [i for i in indices if i < 0 or i >= available]
    if bad or len(set(indices)) != len(indices):
        raise ValueError(f"--gpus {value}: indices must be distinct and < {available}")
    return indices


@dataclass
class WorkerSlot:
    """One supervised worker: its node name, its environment, its process and restarts."""

    name: str
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started: float = 0.0
    #: Descriptors the worker inherits (the reservation of its node name).
    pass_fds: tuple[int, ...] = ()


def plan_workers(
    gpus: list[int], cpu: int | Sequence[int], metrics_port: int,
    warmup_decoder: str = GPU_WARMUP_DECODER,
) -> list[WorkerSlot]:
    """One slot per GPU (pinned, warming up ``warmup_decoder``), then ``cpu`` CPU slots
    (a count: indices 0..cpu-1, or the indices themselves)."""
    cpu_indices = list(range(cpu)) if isinstance(cpu, int) else list(cpu)
    cpu = len(cpu_indices)
    host = socket.gethostname()
    slots = []
    for i in gpus:
        # PCI order: the index means the same GPU to CUDA, NVML and nvidia-smi.
        env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": str(i),
               "FRAMEFLEET_DEVICE": "cuda",
               # Load and warm the decoder before the first job, not during it.
               "FRAMEFLEET_WARMUP_DECODER": warmup_decoder,
               "FRAMEFLEET_METRICS_PORT": str(metrics_port_for(metrics_port, gpu=i))}
        slots.append(WorkerSlot(f"gpu{i}@{host}", env))
    threads = max(1, (os.cpu_count() or 1) // max(1, cpu))
    for j in cpu_indices:
        # CPU workers share the cores: without a cap each torch pool takes them all.
        env = {"CUDA_VISIBLE_DEVICES": "", "FRAMEFLEET_DEVICE": "cpu",
               "OMP_NUM_THREADS": str(threads),
               "FRAMEFLEET_METRICS_PORT": str(metrics_port_for(metrics_port, cpu=j))}
        slots.append(WorkerSlot(f"cpu{j}@{host}", env))
    return slots


class Launcher:
    """Starts and supervises the planned workers until stopped."""

    def __init__(self, slots: list[WorkerSlot], max_backoff_s: float = 60.0,
                 drain_s: float = 600.0) -> None:
        """``drain_s``: how long ``run`` waits for the workers once stopped (``launch`` passes
        ``drain_timeout_s``)."""
        self.slots = slots
        self.max_backoff_s = max_backoff_s
        self.drain_s = drain_s
        self.stopping = threading.Event()
        #: The launcher's exit status: 0, or ``CONFIG_EXIT`` after a worker's configuration
        #: error.
        self.failed = 0

    def _start(self, slot: WorkerSlot) -> None:
        env = dict(os.environ)
        env.update(slot.env)
        slot.proc = subprocess.Popen(worker_command(slot.name), env=env, pass_fds=slot.pass_fds)
        slot.started = time.monotonic()
        log.info("started %s (pid %d)", slot.name, slot.proc.pid)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.stopping.set()
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is None:
                slot.proc.send_signal(sig)

    def run(self, poll_s: float = 1.0) -> int:
        for slot in self.slots:
            self._start(slot)
        next_start: dict[str, float] = {}
        while not self.stopping.is_set():
            now = time.monotonic()
            for slot in self.slots:
                assert slot.proc is not None
                code = slot.proc.poll()
                if code is None:
                    continue
                if code == CONFIG_EXIT:
                    # Its one-line error is above; a restart would fail the same way.
                    log.error("%s: configuration error (exit %d): stopping, not restarting",
                              slot.name, code)
                    self.failed = code
                    self.stop()
                    break
                if slot.name not in next_start:
                    # A worker that lived a while starts over with a short back-off.
                    if now - slot.started > 300:
                        slot.restarts = 0
                    delay = min(self.max_backoff_s, 2.0 ** slot.restarts)
                    slot.restarts += 1
                    log.warning("%s exited with %s; restarting in %.0f s", slot.name, code, delay)
                    next_start[slot.name] = now + delay
                elif now >= next_start[slot.name]:
                    del next_start[slot.name]
                    self._start(slot)
            self.stopping.wait(poll_s)
        # One deadline for all: the workers drain side by side.
        deadline = time.monotonic() + self.drain_s
        for slot in self.slots:
            if slot.proc is not None:
                try:
                    slot.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    log.error("%s still running %.0f s after the stop: killed (its job is "
                              "delivered again)", slot.name, self.drain_s)
                    slot.proc.kill()
                    slot.proc.wait()
        return self.failed


def plan_for(gpus: list[int], cpu: int, settings: Settings,
             names: HostNames | None = None) -> list[WorkerSlot]:
    """``plan_workers`` with the settings' metrics port and warm-up decoder.

    With ``names``, every node name is reserved on this host first: a GPU whose worker another
    launcher runs is refused (two workers on one GPU), and CPU slots take the lowest indices
    no other launcher holds, so their names and metrics ports differ.
    """
    warmup = settings.warmup_decoder or GPU_WARMUP_DECODER
    if names is None:
        return plan_workers(gpus, cpu, settings.metrics_port, warmup)
    host = socket.gethostname()
    for i in gpus:
        if not names.take(f"gpu{i}@{host}"):
            raise ValueError(f"gpu{i}@{host} is already run by another launcher on this host: "
                             "two workers would share the GPU, its node name and its metrics "
                             "port; stop that launcher or choose other GPUs with --gpus")
    free = (j for j in range(MAX_CPU_INDEX) if names.take(f"cpu{j}@{host}"))
    indices = [j for _, j in zip(range(cpu), free, strict=False)]
    if len(indices) < cpu:
        raise ValueError(f"--cpu {cpu}: no free CPU worker name below cpu{MAX_CPU_INDEX}@{host}")
    slots = plan_workers(gpus, indices, settings.metrics_port, warmup)
    for slot in slots:
        slot.pass_fds = names.fds(slot.name)
    return slots


def check_metrics_ports(slots: Sequence[WorkerSlot]) -> None:
    """Refuse to start when a worker's /metrics port is held by another process."""
    for slot in slots:
        port = int(slot.env.get("FRAMEFLEET_METRICS_PORT", "0"))
        if port == 0:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            # As the metrics server binds (SO_REUSEADDR): only a live listener is a clash.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("", port))
            except OSError as e:
                raise ValueError(
                    f"FRAMEFLEET_METRICS_PORT: port {port} of {slot.name} is in use "
                    f"({e.strerror}); free it, or choose another base port (0: no /metrics)"
                ) from e


def check_credentials(settings: Settings) -> None:
    """Raise ``SettingsError`` when the broker or the result backend refuses the password:
    every worker would exit on it (``CONFIG_EXIT``), so none is started."""
    for name, url in (("FRAMEFLEET_BROKER_URL", settings.broker_url),
                      ("FRAMEFLEET_RESULT_BACKEND", settings.backend_url)):
        problem = auth_problem(url, settings)
        if problem:
            raise SettingsError(f"invalid settings: {name}={mask(url)!r}: {problem}")


def launch(gpus: str | None, cpu: int, settings: Settings) -> int:
    """Plan, start and supervise the workers (``--gpus``/``--cpu``) until SIGTERM/SIGINT."""
    check_credentials(settings)
    selected = parse_gpus(gpus, count_gpus()) if gpus else []
    names = HostNames()
    slots = plan_for(selected, cpu, settings, names)
    if not slots:
        raise ValueError("no workers to start: no GPU found; use --cpu N")
    check_metrics_ports(slots)
    log.info("starting %s; a stop waits up to %.0f s for running jobs",
             ", ".join(s.name for s in slots), drain_timeout_s(settings))
    launcher = Launcher(slots, drain_s=drain_timeout_s(settings))

    def forward(signum: int, _frame: object) -> None:
        launcher.stop(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    return launcher.run()
