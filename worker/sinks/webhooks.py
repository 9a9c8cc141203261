"""Webhook delivery: signed JSON POSTs on threads of their own, so a job never waits for one.

One :class:`Notifier` per worker process. A job talks to it through :meth:`Notifier.for_job`,
whose ``emit`` only enqueues: it never blocks, never raises, and a full backlog drops the event
(logged) instead of stalling the GPU. The parts, by role:

- ``webhook_pool``: the bounded backlog, one lane per receiver (scheme, host, port), served by
  ``FRAMEFLEET_WEBHOOK_THREADS`` threads, one thread per lane at a time: a receiver gets its
  events one at a time and in order, and a slow receiver does not delay the others.
- ``webhook_transport``: one POST to a checked address, within one deadline for the whole
  attempt (``FRAMEFLEET_WEBHOOK_TIMEOUT_S``: connect, TLS, send, every read), enforced by a
  watchdog against a receiver that trickles its answer.
- this module: the allow-list check of a job's URLs, signing, judging an answer, and the
  events of one job (:class:`JobEvents`).

A failure (connection error, deadline, HTTP 408/429/5xx) is retried with exponential back-off,
at most ``FRAMEFLEET_WEBHOOK_MAX_ATTEMPTS`` times and for at most ``FRAMEFLEET_WEBHOOK_MAX_AGE_S``;
an answer's ``Retry-After`` (seconds or an HTTP date) delays the next attempt at least that
long, and an event it would push past the age limit is given up at once instead of being
hammered early; any other answer ends the event (2xx: delivered; 3xx: redirects are never
followed; 4xx: refused by the receiver).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from producer.errors import InvalidJobError
from producer.settings import Settings, get_settings
from producer.webhooks.rules import (
    DELIVERY_HEADER,
    EVENT_HEADER,
    EVENT_ID_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    Address,
    Target,
    UrlPolicy,
    signature,
)
from producer.wire.spec import JobResult, JobSpec, NotifyEvent, PreviewInfo, Progress, SegmentInfo
from worker.sinks.hls import PLAYLIST
from worker.sinks.webhook_pool import Delivery, DeliveryPool, Outcome
from worker.sinks.webhook_transport import USER_AGENT, Resolver, post, resolve, retry_after_s

__all__ = ["USER_AGENT", "Address", "Delivery", "JobEvents", "Notifier", "Outcome",
           "close_process_notifier", "process_notifier", "resolve", "retry_after_s"]
log = logging.getLogger(__name__)
RETRY_STATUS = {408, 429}


class Notifier(DeliveryPool):
    """Delivers webhook events of every job of this process; see the module docstring."""

    def __init__(self, settings: Settings | None = None, resolver: Resolver = resolve) -> None:
        settings = settings or get_settings()
        self.policy = UrlPolicy.from_settings(settings)
        self.resolver = resolver
        super().__init__(settings, self._attempt_one)

    def for_job(self, spec: JobSpec, attempt: int = 0,
                holds: Callable[[], bool] | None = None,
                not_lost: Callable[[], bool] | None = None) -> JobEvents:
        """The events of one run of ``spec`` (a no-op when it asks for none). ``holds``: the
        run holds its job's lease now (an event is emitted only then); ``not_lost``: it has
        not lost it (asked again before each attempt)."""
        targets: list[Target] = []
        secret = self.settings.webhook_secret
        if spec.notify is not None:
            if secret is None:
                log.error("job %s asks for webhooks but FRAMEFLEET_WEBHOOK_SECRET is unset: "
                          "none are sent (never unsigned)", spec.job_id)
            else:
                for i, url in enumerate(spec.notify.urls):
                    try:
                        targets.append(self.policy.check_url(url, f"notify.urls[{i}]"))
                    except InvalidJobError as e:  # past a client with other settings
                        log.error("job %s: webhook refused: %s", spec.job_id, e)
        return JobEvents(self, spec, attempt, targets, holds, not_lost)

    def _attempt_one(self, delivery: Delivery) -> str:
        """One POST; never raises."""
        if delivery.may_send is not None and not delivery.may_send():
            log.warning("webhook %s to %s given up: the run that emitted it lost its job's "
                        "lease (the run that took the job over sends its own)", delivery.event,
                        delivery.target.url)
            return Outcome.GIVE_UP
        delivery.attempts += 1
        delivery.retry_after = None
        target = delivery.target
        try:
            addresses = self.resolver(target.host, target.port)
            if not addresses:
                raise OSError(f"{target.host}: no address")
            for addr in addresses:
                self.policy.check_address(addr, target.url, target)
        except InvalidJobError as e:
            log.error("webhook to %s refused after DNS: %s", target.url, e)
            return Outcome.GIVE_UP
        except OSError as e:
            log.warning("webhook to %s: %s (attempt %d)", target.url, e, delivery.attempts)
            return Outcome.RETRY
        timestamp = int(time.time())
        headers = {
            "Content-Type": "application/json",
            EVENT_HEADER: delivery.event,
            DELIVERY_HEADER: delivery.delivery_id,
            EVENT_ID_HEADER: delivery.event_id,
            TIMESTAMP_HEADER: str(timestamp),
            SIGNATURE_HEADER: signature(self._secret(), timestamp, delivery.body),
        }
        try:
            status, delivery.retry_after = post(
                target, addresses, headers, delivery.body, self.settings.webhook_timeout_s)
        except (OSError, http.client.HTTPException) as e:
            log.warning("webhook to %s: %s (attempt %d)", target.url, e, delivery.attempts)
            return Outcome.RETRY
        return self._judge(delivery, status)

    def _judge(self, delivery: Delivery, status: int) -> str:
        if 200 <= status < 300:
            return Outcome.DELIVERED
        url = delivery.target.url
        if status >= 500 or status in RETRY_STATUS:
            log.warning("webhook to %s: HTTP %d (attempt %d)", url, status, delivery.attempts)
            return Outcome.RETRY
        why = "redirects are not followed" if 300 <= status < 400 else "refused by the receiver"
        log.error("webhook to %s: HTTP %d: %s", url, status, why)
        return Outcome.GIVE_UP

    def _secret(self) -> str:
        secret = self.settings.webhook_secret
        assert secret is not None  # for_job sends nothing without one
        return secret.get_secret_value()


class JobEvents:
    """The webhook events of one run of one job: ``emit`` enqueues and returns at once."""

    def __init__(
        self, notifier: Notifier, spec: JobSpec, attempt: int, targets: list[Target],
        holds: Callable[[], bool] | None = None, not_lost: Callable[[], bool] | None = None,
    ) -> None:
        self.notifier = notifier
        self.holds, self.not_lost = holds, not_lost
        self.spec = spec
        self.attempt = attempt
        self.targets = targets
        self.events: set[str] = set(spec.notify.events) if spec.notify is not None else set()
        self.sequence = 0
        self._lock = threading.Lock()  # segment events come from encoder threads

    def event_id(self, *what: object) -> str:
        """The id of one event of this job's submission, the same whichever run sends it:
        ``("end",)``, ``("segment", 3)``, ``("preview", 5)``."""
        text = "\0".join(str(x) for x in (self.spec.key, self.spec.digest(), *what))
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def emit(self, event: NotifyEvent, data: dict[str, Any], event_id: str | None = None) -> None:
        """Send ``event`` with ``data`` to every URL of the job that asked for it, while the
        run holds its job's lease; ``event_id``: the event's own id (default: this run's)."""
        if event not in self.events or not self.targets:
            return
        if self.holds is not None and not self.holds():
            log.warning("job %s: %s webhook not sent: this run does not hold the job's lease",
                        self.spec.key, event)
            return
        try:
            with self._lock:
                self.sequence += 1
                delivery_id = uuid.uuid4().hex
                event_id = event_id or delivery_id
                body = json.dumps({
                    "id": delivery_id, "event_id": event_id, "event": event,
                    "job_id": self.spec.job_id,
                    "tenant": self.spec.tenant, "attempt": self.attempt,
                    "sequence": self.sequence, "created_at": time.time(), "data": data,
                }, separators=(",", ":")).encode()
                now = time.monotonic()
                for target in self.targets:
                    self.notifier.submit(Delivery(
                        target, (self.spec.key, target.url), event, delivery_id, body, now,
                        may_send=self.not_lost, event_id=event_id,
                    ))
        except Exception:  # a notification must never fail the job
            log.exception("job %s: %s event not sent", self.spec.job_id, event)

    def started(self, node: str) -> None:
        self.emit("started", {"worker": node, "spec_digest": self.spec.digest()})

    def preview(self, preview: PreviewInfo) -> None:
        """A preview was stored (a ``Run.preview_hooks`` entry): only for receivers that ask
        for ``preview`` events."""
        self.emit("preview", {"preview": preview.model_dump(mode="json")},
                  self.event_id("preview", preview.step))

    def segment(self, seg: SegmentInfo, progress: Progress) -> None:
        """Segment ``seg`` joined the live playlist (a ``Run.segment_hooks`` entry)."""
        self.emit("segment", {"segment": seg.model_dump(mode="json"),
                              "progress": progress.model_dump(mode="json"),
                              "playlist_uri": f"{self.spec.output_prefix}/{PLAYLIST}"},
                  self.event_id("segment", seg.index))

    def succeeded(self, result: JobResult) -> None:
        self.emit("succeeded", {"result": result.model_dump(mode="json")}, self.event_id("end"))

    def failed(self, error: BaseException) -> None:
        if not isinstance(error, Exception):
            return  # SystemExit, KeyboardInterrupt: the worker stops, the job is redelivered
        self.emit("failed", {"error": {"type": type(error).__name__, "message": str(error)}},
                  self.event_id("end"))

    def cancelled(self, message: str) -> None:
        self.emit("cancelled", {"message": message}, self.event_id("end"))


_process: tuple[int, Notifier] | None = None
_process_lock = threading.Lock()


def process_notifier(settings: Settings | None = None) -> Notifier:
    """This process's notifier, started on first use (after a fork: a new one, since the
    parent's delivery thread does not exist in the child)."""
    global _process
    with _process_lock:
        if _process is None or _process[0] != os.getpid():
            _process = (os.getpid(), Notifier(settings))
        return _process[1]


def close_process_notifier(timeout: float) -> None:
    """Flush and stop this process's notifier, if it was started."""
    global _process
    with _process_lock:
        current, _process = _process, None
    if current is not None and current[0] == os.getpid():
        current[1].close(timeout)
