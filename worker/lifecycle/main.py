"""The worker's Celery entry point: ``celery -A worker.lifecycle.main worker``
(``producer.app.worker_command``).

Builds the worker's app from the environment's settings with the app factory, and adds what
only a worker has: the task (``worker.tasks.register``), the consumer that records FAILURE for
undecodable messages and the guard against queue items that are not messages
(``worker.lifecycle.consumer``), and the worker's lifecycle: decoders, warm-up and /metrics in
the pool process that runs jobs, the spot interruption watcher in the main process.
"""

from __future__ import annotations

# ruff: noqa: E402 - the readahead below starts before the imports after it
# First thing, before the imports below take their seconds (torch, diffusers, Celery): the
# warm-up model's weight files start streaming into the page cache, so that a new host's disk,
# the longest step of its start, is read from the process's first moments.
from producer.settings import get_settings
from worker.lifecycle import readahead

readahead.begin_from_settings(get_settings)

import logging
import os
import sys
import time
from typing import Any, NoReturn

from celery import Celery
from celery.signals import (
    celeryd_init,
    task_revoked,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
    worker_shutting_down,
)

from producer.app import make_app
from producer.cost import configured_prices
from producer.errors import SettingsError
from producer.settings import Settings
from producer.state.control import flags_for
from worker import metrics, tasks
from worker.concerns.cancel import preempt_node
from worker.lifecycle import persistence, recovery, shutdown, startphases, warmup
from worker.lifecycle.consumer import install_brpop_guard
from worker.lifecycle.launcher import CONFIG_EXIT, check_credentials
from worker.lifecycle.poolwatch import POOL_START_EXIT, PoolWatch, start_timeout
from worker.lifecycle.spot import SpotWatcher
from worker.memory import limit_mib
from worker.owner import DEVICE
from worker.watchdog import WATCHDOG

log = logging.getLogger(__name__)


def build_worker_app(settings: Settings) -> Celery:
    """The app a worker runs: ``make_app(settings)`` plus the task and the hardened consumer."""
    app = make_app(settings=settings)
    app.conf.worker_consumer = "worker.lifecycle.consumer:FramefleetConsumer"
    # The memory guard fails a job over the limit between steps; a pool process still over it
    # once its job has ended is replaced by Celery (KiB), instead of failing every next job.
    limit = limit_mib(settings)
    if limit is not None:
        app.conf.worker_max_memory_per_child = limit * 1024
    # A pool process is up only after its warm-up: Celery's 4 s would kill every replacement
    # of a lost one before it could start (``worker.lifecycle.poolwatch``).
    app.conf.worker_proc_alive_timeout = start_timeout(settings)
    install_brpop_guard()
    tasks.register(app)
    return app


def exit_config_error(message: str) -> NoReturn:
    """One ``error:`` line and exit ``CONFIG_EXIT``: restarting cannot help, and the launcher
    stops instead of restarting a worker that exits so."""
    sys.stderr.write("error: " + " ".join(message.split()) + "\n")
    sys.stderr.flush()
    raise SystemExit(CONFIG_EXIT)


@worker_init.connect
def _check_credentials(**_: Any) -> None:
    """In the main process, before the consumer connects (and before "ready")."""
    try:
        check_credentials(get_settings())
    except SettingsError as e:
        exit_config_error(str(e))


@worker_process_init.connect
def _init_process(**_: Any) -> None:
    """Runs in the pool child that executes tasks: the first place CUDA may be touched.

    The /metrics server and the NVML sampler live here too, in the process that runs jobs
    (prometheus_client's registry is per process). A start that fails ends this process with
    one critical log: Celery would only log the error and hand jobs to a process without its
    decoders (the main process's ``PoolWatch`` stops the worker if no start succeeds).
    """
    try:
        _start_process(get_settings())
    except Exception:
        log.critical("pool process %d could not start", os.getpid(), exc_info=True)
        logging.shutdown()
        os._exit(POOL_START_EXIT)


def _start_process(settings: Settings) -> None:
    hook = time.time()
    DEVICE.idle_s = settings.build_idle_s
    WATCHDOG.backstop = True  # a hang that holds the GIL is caught too (worker.watchdog)
    started = startphases.main_started_at()
    # Before anything in this process can compile (the decoder cache, a benchmark's own
    # models, the warm-up): a compile before it would read and fill another folder.
    warmup.use_compile_cache(settings.compile_cache_dir)
    decoders = tasks.init_decoders(settings)
    try:
        port = metrics.start_metrics_server(settings.metrics_port)
    except OSError as e:  # a taken port must not keep a GPU from working
        log.error("metrics server on port %s not started: %s", settings.metrics_port, e)
        port = 0
    metrics.set_gpu_price(configured_prices())
    # Weights loaded, the warm-up model's transformer and the decoder's graphs compiled (from
    # the compile cache) and captured before the first job, not during it; the worker reports
    # ready (healthcheck, gauge) only after this.
    state = warmup.warm_up(decoders, settings, started=started, node=_node, phases={
        "imports": max(0.0, hook - started), "init": time.time() - hook})
    if decoders.device.type == "cuda":
        shutdown.start_sampler()
    compiled = startphases.compiled(state.model)
    log.info("framefleet worker process ready on %s (metrics port %s), %s%s", decoders.device,
             port, startphases.ready_line(state.phases, state.critical),
             f"; compiled: {compiled}" if compiled else "")


_watcher: SpotWatcher | None = None
#: This worker's Celery node name (``gpu0@host``), set in the main process before its pool
#: processes fork, so that each one's readiness state names it.
_node: str | None = None


@celeryd_init.connect
def _remember_node(sender: Any = None, **_: Any) -> None:
    global _node
    _node = str(sender) if sender else None
_pool_watch: PoolWatch | None = None


@worker_ready.connect
def _mark_pool_up(**_: Any) -> None:
    """In the main process, its first pool processes started: a later one is a replacement
    (its ready line counts from its own fork, not from this process's start)."""
    startphases.pool_up()


@worker_ready.connect
def _start_pool_watch(sender: Any = None, **_: Any) -> None:
    """In the main process: stop the worker once its pool processes keep failing to start."""
    global _pool_watch
    pool = getattr(getattr(sender, "pool", None), "_pool", None)
    if pool is None or not hasattr(pool, "_pool"):  # not the prefork pool: nothing to watch
        return
    _pool_watch = PoolWatch(pool, get_settings())
    _pool_watch.start()


@worker_ready.connect
def _start_spot_watcher(sender: Any = None, **_: Any) -> None:
    """In the worker's main process (``sender`` is its consumer): on a spot notice, stop
    consuming and flag the node so its running job stops between chunks and is requeued."""
    global _watcher
    settings = get_settings()
    if not settings.spot_watch or sender is None:
        return
    worker_app: Celery = sender.app
    node = str(sender.hostname)

    def on_notice(notice: dict[str, Any]) -> None:
        preempt_node(worker_app, node)
        log.warning("%s: spot notice %s: stopped consuming, handing back its job", node, notice)

    _watcher = SpotWatcher(settings.imds_url, settings.spot_poll_s, on_notice)
    _watcher.start()


@worker_shutting_down.connect
def _stop_pool_watch(**_: Any) -> None:
    """From the start of a shutdown (worker_shutdown comes after the pool stopped): a pool
    process that ends now, or one Celery starts while it shuts down, ends with the worker and
    is no failed start."""
    if _pool_watch is not None:
        _pool_watch.stopped.set()


@worker_shutdown.connect
def _stop_spot_watcher(**_: Any) -> None:
    if _watcher is not None:
        _watcher.stop()
    if _pool_watch is not None:
        _pool_watch.stopped.set()


@worker_process_init.connect
def _check_broker_persistence(**_: Any) -> None:
    """Warn (log + framefleet_broker_persistent) when a Redis restart would lose queued jobs.

    In the pool process, so the gauge is the one its /metrics serves."""
    persistence.check_at_start(str(app.conf.broker_url))


@worker_ready.connect
def _start_recovery(sender: Any = None, **_: Any) -> None:
    """In the main process: keep this worker's held messages fresh, and requeue, exactly
    once, the jobs of hosts that vanished (``worker.lifecycle.recovery``)."""
    if sender is not None:
        recovery.start(sender.app, str(sender.hostname))


@worker_shutdown.connect
def _stop_recovery(**_: Any) -> None:
    recovery.stop()


@worker_process_shutdown.connect
def _stop_process(**_: Any) -> None:
    """Before the pool process exits: queued webhook deliveries get a few seconds, and the
    threads it started are stopped and joined (``worker.lifecycle.shutdown``)."""
    shutdown.stop_process()


@task_revoked.connect
def _mark_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    """A job dropped on receipt because it was revoked (cancelled while queued) never reaches
    the task: mark it received all the same, so that a resubmit after its REVOKED result
    expired sends it again instead of waiting on PENDING for ever (``producer.client``)."""
    job_id = getattr(request, "id", None)
    if sender is None or not job_id:
        return
    try:
        flags_for(sender.app).mark_started(str(job_id))
    except Exception as e:  # noqa: BLE001 - a signal handler must not break the consumer
        log.warning("job %s: revoked, not marked received: %s", job_id, e)


def _settings() -> Settings:
    try:
        return get_settings()
    except SettingsError as e:  # one line, not Celery's "Unable to load celery application"
        exit_config_error(str(e))


#: The app ``celery -A worker.lifecycle.main`` finds.
app = build_worker_app(_settings())
