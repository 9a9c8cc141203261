"""The Celery app factory: the fleet's delivery semantics live here.

Nothing is built at import. ``make_app(settings)`` builds an app for whoever asks: the client
(``producer.client``), the worker entry point (``worker.lifecycle.main``, which adds the task
and the hardened consumer), Flower's dashboard (``producer.ops.dashboard``) and the embedded demo.

- JSON only: anyone who can write to Redis must not be able to run code (no pickle).
- ``acks_late`` + ``reject_on_worker_lost``: a job whose worker dies is delivered again.
- prefetch 1, concurrency 1 per GPU: a worker holds at most the job it runs.
- Redis ``visibility_timeout`` above the longest job time limit, in the broker AND the result
  backend transport options; otherwise Redis re-delivers a job that is still running
  (celery issue 5935: with acks_late, an unacked message is re-queued after the timeout).
- ``sentinel://`` URLs (Redis behind Sentinel) get ``master_name`` and ``sentinel_kwargs`` in
  the same transport options: kombu and Celery then connect to whichever server the
  Sentinels name the primary, and reconnect to the promoted replica after a failover.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from celery import Celery
from kombu import Queue

from producer.settings import Settings, get_settings
from producer.state.broker import sentinel_options

#: The one task of the fleet, as producers send it and workers register it.
TASK_NAME = "framefleet.decode_video"
#: The queue every job goes to and every worker consumes.
QUEUE = "video"
#: The module ``celery -A`` loads to run a worker (it builds the app with the task).
#: The message header the client stamps at send: unix time (float) the job was enqueued
#: (the queue wait, the oldest waiting job's age).
ENQUEUED_AT_HEADER = "framefleet_enqueued_at"
WORKER_APP = "worker.lifecycle.main"


def embedded_urls(data_dir: str | Path) -> tuple[str, str, dict[str, Any]]:
    """Broker URL, backend URL and transport options of the server-less embedded mode."""
    root = Path(data_dir).absolute()
    folder = root / "broker"
    for sub in ("in", "processed", "control"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    options = {
        "data_folder_in": str(folder / "in"),
        "data_folder_out": str(folder / "in"),
        "processed_folder": str(folder / "processed"),
        "store_processed": False,
        "control_folder": str(folder / "control"),
    }
    return "filesystem://", f"db+sqlite:///{root / 'results.sqlite'}", options


def make_app(
    broker_url: str | None = None,
    backend_url: str | None = None,
    settings: Settings | None = None,
) -> Celery:
    """Build a framefleet Celery app; URLs default to ``settings`` (default: the environment).

    The app has no tasks: the producer only sends them by name (``TASK_NAME``), and the worker
    entry point registers the task on the app it builds.
    """
    s = settings or get_settings()
    broker = broker_url or s.broker_url
    backend = backend_url or (s.backend_url if broker_url is None else broker_url)
    transport: dict[str, Any] = {
        "visibility_timeout": s.visibility_timeout,
        # Redis has no native priorities: kombu keeps one list per step (0 = most urgent).
        "priority_steps": list(range(10)),
        "queue_order_strategy": "priority",
    }
    backend_transport: dict[str, Any] = {"visibility_timeout": s.visibility_timeout}
    if broker.startswith("sentinel://"):
        transport.update(sentinel_options(s))
    if backend.startswith("sentinel://"):
        backend_transport.update(sentinel_options(s))
    if broker.startswith("filesystem://"):
        broker, _, transport = embedded_urls(s.data_dir)
        if backend_url is None and s.result_backend is None:
            backend = embedded_urls(s.data_dir)[1]
    app = Celery("framefleet", broker=broker, backend=backend)
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        event_serializer="json",
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=1,
        worker_concurrency=1,
        task_track_started=True,
        task_send_sent_event=True,
        worker_send_task_events=True,
        result_extended=True,
        result_expires=s.result_expires_s,
        broker_transport_options=transport,
        result_backend_transport_options=backend_transport,
        # A Redis restart must not fail a running job: store_result reads the old state
        # before it writes, and only the write is retried unless this is on.
        result_backend_always_retry=True,
        result_backend_max_retries=20,
        broker_connection_retry_on_startup=True,
        task_default_queue=QUEUE,
        task_queues=[Queue(QUEUE, routing_key=QUEUE)],
        task_routes={TASK_NAME: {"queue": QUEUE}},
        task_default_priority=4,
        worker_hijack_root_logger=False,
    )
    return app


def redis_priority(priority: int) -> int:
    """JobSpec priority (9 most urgent) → kombu Redis priority (0 most urgent)."""
    return 9 - priority


def worker_command(
    name: str, *, events: bool = True, alone: bool = False, loglevel: str = "INFO"
) -> list[str]:
    """The command line of one worker process (one job at a time) named ``name``.

    ``events``: send task events (Flower, the e2e tests). ``alone``: the only worker on its
    broker (the embedded demo), so no gossip, mingle or heartbeat with peers.
    """
    cmd = [sys.executable, "-m", "celery", "-A", WORKER_APP, "worker", "-Q", QUEUE,
           "-c", "1", "--prefetch-multiplier", "1", "-n", name, "-l", loglevel]
    if events:
        cmd.append("-E")
    if alone:
        cmd += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
    return cmd
