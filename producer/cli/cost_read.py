"""What ``framefleet cost report`` reads: finished jobs' results and the held runs of jobs that
ended without one, from the result backend's Redis, over a window of time."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from pydantic import ValidationError

from producer.errors import UnsupportedBackendError
from producer.state.keys import HELD_PREFIX
from producer.wire.spec import HeldRun, JobResult

if TYPE_CHECKING:
    from celery import Celery

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}


def parse_duration(text: str) -> float | None:
    """``90s``, ``30m``, ``24h``, ``7d``, ``2w`` → seconds; ``all`` → None (no limit)."""
    if text.strip().lower() == "all":
        return None
    match = _DURATION.match(text.lower())
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"not a duration: {text!r} (use e.g. 90m, 24h, 7d, or 'all')")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def _batched(items: Iterable[bytes], size: int) -> Iterator[list[bytes]]:
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def read_results(app: Celery, *, since: float | None = None, batch: int = 500) -> list[JobResult]:
    """JobResults of SUCCESS tasks in the app's Redis result backend, oldest first.

    Scans the ``celery-task-meta-*`` keys (SCAN, so Redis is never blocked), decodes each with
    the backend's own serializer and keeps the results that validate as :class:`JobResult`
    (other tasks' results are skipped) and finished at or after ``since`` (unix time).
    Raises :class:`UnsupportedBackendError` for any backend other than Redis.
    """
    from celery.backends.redis import RedisBackend

    backend = app.backend
    if not isinstance(backend, RedisBackend):
        raise UnsupportedBackendError(
            f"cost report reads finished jobs from a Redis result backend; "
            f"{type(backend).__name__} is not supported"
        )
    prefix = backend.task_keyprefix  # bytes; includes any global_keyprefix
    client = backend.client
    results = []
    for keys in _batched(client.scan_iter(match=prefix + b"*", count=batch), batch):
        for raw in client.mget(keys):
            if raw is None:  # expired between SCAN and MGET
                continue
            meta = backend.decode(raw)
            if not isinstance(meta, dict) or meta.get("status") != "SUCCESS":
                continue
            try:
                result = JobResult.model_validate(meta.get("result"))
            except ValidationError:
                continue
            if since is None or result.finished_at >= since:
                results.append(result)
    results.sort(key=lambda r: r.finished_at)
    return results


def read_held(app: Celery, *, since: float | None = None, batch: int = 500) -> list[HeldRun]:
    """The HeldRun records (runs without a JobResult) in the app's Redis, oldest first.

    Written by the workers next to the results (``producer.state.keys.held``); records that
    do not validate are skipped. Raises :class:`UnsupportedBackendError` unless Redis.
    """
    from celery.backends.redis import RedisBackend

    backend = app.backend
    if not isinstance(backend, RedisBackend):
        raise UnsupportedBackendError(
            f"cost report reads finished jobs from a Redis result backend; "
            f"{type(backend).__name__} is not supported"
        )
    client = backend.client
    held = []
    for keys in _batched(client.scan_iter(match=HELD_PREFIX + "*", count=batch), batch):
        for raw in client.mget(keys):
            if raw is None:
                continue
            try:
                run = HeldRun.model_validate_json(raw)
            except ValidationError:
                continue
            if since is None or run.finished_at >= since:
                held.append(run)
    held.sort(key=lambda h: h.finished_at)
    return held
