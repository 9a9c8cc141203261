"""The worker's entry point: ``celery -A worker.main worker`` (``producer.app.worker_command``).

Builds the worker's app from the environment's settings with the app factory, and adds what
only a worker has: the task (``worker.tasks.register``), the consumer that records FAILURE for
undecodable messages and the guard against queue items that are not messages
(``worker.consumer``), and the worker's lifecycle: decoders, warm-up and /metrics in the pool
process that runs jobs, the spot interruption watcher in the main process.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery import Celery
from celery.signals import worker_process_init, worker_ready, worker_shutdown

from producer.app import make_app
from producer.cost import configured_prices
from producer.settings import Settings, get_settings
from producer.spec import RANDOM_WEIGHTS, DecoderSpec
from producer.weights import needs_weights
from worker import metrics, tasks
from worker.concerns.cancel import preempt_node
from worker.consumer import install_brpop_guard
from worker.spot import SpotWatcher

log = logging.getLogger(__name__)


def build_worker_app(settings: Settings) -> Celery:
    """The app a worker runs: ``make_app(settings)`` plus the task and the hardened consumer."""
    app = make_app(settings=settings)
    app.conf.worker_consumer = "worker.consumer:FramefleetConsumer"
    install_brpop_guard()
    tasks.register(app)
    return app


@worker_process_init.connect
def _init_process(**_: Any) -> None:
    """Runs in the pool child that executes tasks: the first place CUDA may be touched.

    The /metrics server and the NVML sampler live here too, in the process that runs jobs
    (prometheus_client's registry is per process). A broken pricing file fails here, loudly.
    """
    settings = get_settings()
    decoders = tasks.init_decoders(settings)
    try:
        port = metrics.start_metrics_server(settings.metrics_port)
    except OSError as e:  # a taken port must not keep a GPU from working
        log.error("metrics server on port %s not started: %s", settings.metrics_port, e)
        port = 0
    metrics.set_gpu_price(configured_prices())
    if settings.warmup_decoder is not None:
        # Weights loaded and kernels warmed before the first job, not during it.
        h, w = (int(v) for v in settings.warmup_latent_size.split("x"))
        # Random weights, by name: the warm-up compiles the architecture's kernels; a job
        # brings its own weights.
        decoder = decoders.get(DecoderSpec(
            name=settings.warmup_decoder,
            weights=RANDOM_WEIGHTS if needs_weights(settings.warmup_decoder) else None))
        t0 = time.perf_counter()
        decoder.warmup(h, w)
        log.info("warmed up %s at %dx%d latents in %.1f s", decoder.name, h, w,
                 time.perf_counter() - t0)
    if decoders.device.type == "cuda":
        metrics.NvmlSampler().start()
    log.info("framefleet worker process ready on %s (metrics port %s)", decoders.device, port)


_watcher: SpotWatcher | None = None


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


@worker_shutdown.connect
def _stop_spot_watcher(**_: Any) -> None:
    if _watcher is not None:
        _watcher.stop()


#: The app ``celery -A worker.main`` finds.
app = build_worker_app(get_settings())
