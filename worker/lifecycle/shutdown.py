"""A pool process's clean exit: what it started is stopped and joined before it goes.

Celery ends a pool process after its last job on a warm shutdown (and on
``worker_max_memory_per_child``); ``worker.lifecycle.main`` calls ``stop_process`` from
``worker_process_shutdown``. The process's own threads (the stuck-job watchdog, the NVML
sampler, the /metrics server, the webhook deliveries, tqdm's monitor that a dependency's
progress bar started) are stopped in turn, and torch.compile's
compile-worker pool is shut down: a pool of subprocesses and a thread still alive while the
interpreter tears down is how a process ends with ``terminate called without an active
exception`` instead of 0. Whatever thread is still running afterwards is named in the log.

The device's owner goes first (``worker.owner``): queued builds are dropped and a running one
ends before the compile workers it may use are shut down.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from worker import metrics
from worker.owner import DEVICE
from worker.sinks.webhooks import close_process_notifier
from worker.watchdog import WATCHDOG

log = logging.getLogger(__name__)

#: Seconds queued webhook deliveries get before the process ends.
WEBHOOK_FLUSH_S = 5.0
_sampler: metrics.NvmlSampler | None = None


def start_sampler() -> None:
    """Start this process's NVML sampler (CUDA workers), stopped by ``stop_process``."""
    global _sampler
    _sampler = metrics.NvmlSampler()
    _sampler.start()


def stop_compile_workers() -> None:
    """Shut down torch.compile's compile-worker pool, and its thread pool (the CPU's C++
    kernels build there), if this process compiled anything."""
    if "torch._inductor.async_compile" not in sys.modules:  # never imported: nothing to stop
        return
    from torch._inductor import async_compile

    async_compile.shutdown_compile_workers()
    threads: Any = getattr(async_compile.AsyncCompile, "pool", None)
    if hasattr(threads, "cache_info") and threads.cache_info().currsize:  # made by a compile
        threads().shutdown(wait=True)  # idle by now: joined at once
        threads.cache_clear()


def stop_progress_monitors() -> None:
    """Stop tqdm's monitor threads, which a dependency's progress bar started (a model load;
    each tqdm subclass keeps its own)."""
    if "tqdm" not in sys.modules:
        return
    from tqdm import TMonitor

    for thread in threading.enumerate():
        if isinstance(thread, TMonitor):
            thread.exit()


def stop_process(timeout: float = WEBHOOK_FLUSH_S) -> list[str]:
    """Stop and join what this process started; returns the names of the threads still
    running afterwards (logged as a warning when there are any)."""
    global _sampler
    steps: list[tuple[str, Callable[[], object]]] = [
        ("device builds", lambda: DEVICE.close(timeout=30.0)),
        ("watchdog", WATCHDOG.close),
        ("webhooks", lambda: close_process_notifier(timeout=timeout)),
        ("metrics server", metrics.stop_metrics_server),
        ("compile workers", stop_compile_workers),
        ("progress monitors", stop_progress_monitors),
    ]
    if _sampler is not None:
        sampler, _sampler = _sampler, None
        steps.insert(1, ("NVML sampler", sampler.stop))
    for name, stop in steps:
        try:
            stop()
        except Exception:  # one that fails must not keep the others running
            log.exception("pool process %d: %s not stopped", os.getpid(), name)
    left = sorted(t.name for t in threading.enumerate()
                  if t is not threading.current_thread() and t.is_alive())
    if left:
        log.warning("pool process %d stopped; threads left running: %s", os.getpid(),
                    ", ".join(left))
    else:
        log.info("pool process %d stopped", os.getpid())
    return left
