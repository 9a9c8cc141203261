"""At worker start: say loudly when the broker would lose queued jobs on a restart.

Runs in the pool process that serves /metrics (``worker_process_init``), so that the gauge
``framefleet_broker_persistent`` is the one Prometheus scrapes.
"""

from __future__ import annotations

import logging

import redis

from producer.state.broker import GAUGE, Persistence, check_broker_url
from worker import metrics

log = logging.getLogger(__name__)


def check_at_start(broker_url: str) -> Persistence | None:
    """Read the broker's persistence, log a warning unless it is an AOF, set the gauge."""
    try:
        found = check_broker_url(broker_url)
    except redis.RedisError as e:  # the worker retries its broker connection by itself
        log.warning("broker persistence not checked: %s", e)
        return None
    if found is None:
        return None
    metrics.BROKER_PERSISTENT.set(GAUGE[found.level])
    if found.safe:
        log.info("broker persistence: %s", found.detail)
    else:
        log.warning("broker persistence %s: %s (framefleet doctor checks the deployment)",
                    found.level, found.detail)
    return found
