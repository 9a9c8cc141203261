"""Stuck jobs: the count of runs taken for hung.

A pool process taken for hung ends right away, and a count kept in it would die with it
before any scrape. So the stuck run is recorded in the job's run record, and the run that
finds that record (the job's next delivery, which the poison cap fails) counts it here: one
count per stuck run, in a process that lives on to be scraped.
"""

from __future__ import annotations

from prometheus_client import Counter

from worker.metrics.registry import WORKER_REGISTRY
from worker.watchdog import stage_label

STUCK = Counter(
    "framefleet_jobs_stuck_total",
    "Runs taken for hung (no progress for FRAMEFLEET_STUCK_S): their pool process dumped its"
    " stacks and was retired. By the stage the progress stopped in (start, wait_device, load,"
    " denoise, decode, upload, other); counted by the worker that delivers the job next.",
    ["stage"],
    registry=WORKER_REGISTRY,
)


def observe_stuck(stage: str) -> None:
    """Count one stuck run in ``stage``."""
    STUCK.labels(stage=stage_label(stage)).inc()
