"""One Celery worker process per GPU, pinned with CUDA_VISIBLE_DEVICES, supervised.

The launcher itself never initialises CUDA (GPUs are counted through NVML or ``nvidia-smi``):
CUDA is initialised only in the worker's pool process that runs tasks. A worker that dies is
restarted with exponential back-off; SIGTERM/SIGINT are forwarded for a warm shutdown (the
running job finishes; with acks_late an unfinished job is redelivered).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass

from producer.app import worker_command
from producer.ports import metrics_port_for
from producer.settings import Settings

log = logging.getLogger(__name__)
#: The decoder a GPU worker warms up when ``FRAMEFLEET_WARMUP_DECODER`` is unset.
GPU_WARMUP_DECODER = "wan2.1-vae"


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
    indices = [int(v) for v in value.split(",") if v.strip()]
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


def plan_workers(
    gpus: list[int], cpu: int, metrics_port: int, warmup_decoder: str = GPU_WARMUP_DECODER
) -> list[WorkerSlot]:
    """One slot per GPU (pinned, warming up ``warmup_decoder``), then ``cpu`` CPU slots."""
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
    for j in range(cpu):
        # CPU workers share the cores: without a cap each torch pool takes them all.
        env = {"CUDA_VISIBLE_DEVICES": "", "FRAMEFLEET_DEVICE": "cpu",
               "OMP_NUM_THREADS": str(threads),
               "FRAMEFLEET_METRICS_PORT": str(metrics_port_for(metrics_port, cpu=j))}
        slots.append(WorkerSlot(f"cpu{j}@{host}", env))
    return slots


class Launcher:
    """Starts and supervises the planned workers until stopped."""

    def __init__(self, slots: list[WorkerSlot], max_backoff_s: float = 60.0) -> None:
        self.slots = slots
        self.max_backoff_s = max_backoff_s
        self.stopping = threading.Event()

    def _start(self, slot: WorkerSlot) -> None:
        env = dict(os.environ)
        env.update(slot.env)
        slot.proc = subprocess.Popen(worker_command(slot.name), env=env)
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
        for slot in self.slots:
            if slot.proc is not None:
                try:
                    slot.proc.wait(timeout=600)
                except subprocess.TimeoutExpired:
                    slot.proc.kill()
        return 0


def plan_for(gpus: list[int], cpu: int, settings: Settings) -> list[WorkerSlot]:
    """``plan_workers`` with the settings' metrics port and warm-up decoder."""
    return plan_workers(gpus, cpu, settings.metrics_port,
                        settings.warmup_decoder or GPU_WARMUP_DECODER)


def launch(gpus: str | None, cpu: int, settings: Settings) -> int:
    """Plan, start and supervise the workers (``--gpus``/``--cpu``) until SIGTERM/SIGINT."""
    selected = parse_gpus(gpus, count_gpus()) if gpus else []
    slots = plan_for(selected, cpu, settings)
    if not slots:
        raise ValueError("no workers to start: no GPU found; use --cpu N")
    launcher = Launcher(slots)

    def forward(signum: int, _frame: object) -> None:
        launcher.stop(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    return launcher.run()
