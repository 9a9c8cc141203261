"""Celery's consumer, hardened against messages that are not framefleet jobs.

- A well-formed envelope whose body cannot be decoded (not JSON, or a refused content type
  such as pickle): Celery logs and acks it; we also mark its task id FAILURE with a message
  saying why, so the submitter sees a clear error instead of a job PENDING forever, unless
  that id is a submitted job's (the registry knows it): its result is never overwritten.
- An item that is not even a kombu envelope (raw bytes pushed onto the Redis list by hand):
  kombu's Redis channel raises while decoding it and Celery stops the whole worker
  ("Unrecoverable error"). ``install_brpop_guard()`` drops such an item with a critical log
  instead; BRPOP already removed it, so nothing else is lost and the worker stays up.

Nothing happens at import: the worker entry point (``worker.lifecycle.main``) names the
consumer class in its app's configuration and installs the guard.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.worker.consumer import Consumer
from kombu.transport import redis as kombu_redis

from producer.errors import InvalidJobError
from producer.ops.exporter import count_undecodable
from producer.state.control import flags_for

log = logging.getLogger(__name__)


class FramefleetConsumer(Consumer):  # type: ignore[misc]
    """Celery's consumer that also records FAILURE for a message it cannot decode."""

    def _fail(self, message: Any, exc: Exception) -> None:
        task_id = (message.headers or {}).get("id")
        if not task_id:
            return
        count_undecodable(self.app.conf.broker_url)  # the fleet exporter serves the count
        try:
            known = flags_for(self.app).registered(str(task_id)) is not None
        except Exception:  # noqa: BLE001 - Redis away: store nothing rather than overwrite
            known = True
        if known:
            # A submitted job's id on a message that is not that job: never overwrite it.
            log.critical("undecodable message names the job %s: dropped, nothing stored",
                         task_id)
            return
        error = InvalidJobError(
            f"message could not be decoded (content type {message.content_type!r}; "
            f"framefleet accepts JSON only): {exc}"
        )
        try:
            self.app.backend.mark_as_failure(task_id, error)
        except Exception:
            log.exception("could not record FAILURE for undecodable message %s", task_id)

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        self._fail(message, exc)
        super().on_decode_error(message, exc)

    def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
        self._fail(message, exc)
        super().on_invalid_task(body, message, exc)


def install_brpop_guard() -> None:
    """Patch kombu's Redis channel so that an item that is not an envelope is dropped, not
    fatal. Idempotent: a second call leaves the one guard in place."""
    original = kombu_redis.Channel._brpop_read
    if getattr(original, "framefleet_guard", False):
        return

    def guarded(self: Any, **options: Any) -> Any:
        try:
            return original(self, **options)
        except (ValueError, KeyError, TypeError) as e:
            log.critical("dropped an item of the queue that is not a message envelope: %r", e)
            raise kombu_redis.Empty() from e

    guarded.framefleet_guard = True  # type: ignore[attr-defined]
    kombu_redis.Channel._brpop_read = guarded  # type: ignore[method-assign]
