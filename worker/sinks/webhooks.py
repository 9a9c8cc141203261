"""Webhook delivery: signed JSON POSTs on a thread of their own, so a job never waits for one.

One :class:`Notifier` per worker process owns a bounded queue and one delivery thread (the
pipeline's thread shape: bounded queue, stop flag, ``get(timeout=…)``). A job talks to it
through :meth:`Notifier.for_job`, whose ``emit`` only enqueues: it never blocks, never raises,
and a full queue drops the event (logged) instead of stalling the GPU.

Deliveries to one URL of one job go out in the order they were emitted: an event that failed
holds the later ones back until it is delivered or given up. A failure (connection error,
timeout, HTTP 408/429/5xx) is retried with exponential back-off, at most
``FRAMEFLEET_WEBHOOK_MAX_ATTEMPTS`` times and for at most ``FRAMEFLEET_WEBHOOK_MAX_AGE_S``;
an answer's ``Retry-After`` (seconds or an HTTP date) delays the next attempt at least that
long, and an event it would push past the age limit is given up at once instead of being
hammered early;
any other answer ends the event (2xx: delivered; 3xx: redirects are never followed; 4xx:
refused by the receiver). One slow receiver delays the deliveries behind it by at most its
timeout per attempt, never a job.

Each attempt resolves the host, refuses it unless every address passes the allow-list
(producer/webhooks.py), and connects to the checked address itself (``http.client`` with the
socket opened here; TLS still verifies the host name), so DNS cannot answer differently
between the check and the connection. No proxy environment variables are honoured.
"""

from __future__ import annotations

import email.utils
import http.client
import ipaddress
import json
import logging
import os
import queue
import socket
import ssl
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from producer.errors import InvalidJobError
from producer.settings import Settings, get_settings
from producer.spec import JobResult, JobSpec, NotifyEvent, Progress, SegmentInfo
from producer.webhooks import (
    DELIVERY_HEADER,
    EVENT_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    Address,
    Target,
    UrlPolicy,
    signature,
)
from worker.sinks.hls import PLAYLIST

log = logging.getLogger(__name__)
USER_AGENT = "framefleet-webhooks/1"
RETRY_STATUS = {408, 429}
#: Resolves (host, port) to the addresses to try, in order (a parameter for tests).
Resolver = Callable[[str, int], list[Address]]


def resolve(host: str, port: int) -> list[Address]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [ipaddress.ip_address(info[4][0]) for info in infos]


class _PinnedHTTP(http.client.HTTPConnection):
    """HTTP to a checked address; Host header and URL keep the name."""

    def __init__(self, host: str, port: int, address: Address, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self.address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((str(self.address), self.port), self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    """HTTPS to a checked address; the certificate is verified against the host name."""

    def __init__(self, host: str, port: int, address: Address, timeout: float) -> None:
        self.tls = ssl.create_default_context()
        super().__init__(host, port, timeout=timeout, context=self.tls)
        self.address = address

    def connect(self) -> None:
        sock = socket.create_connection((str(self.address), self.port), self.timeout)
        self.sock = self.tls.wrap_socket(sock, server_hostname=self.host)


@dataclass
class Delivery:
    """One event for one URL, retried until delivered or given up."""

    target: Target
    channel: tuple[str, str]  # (job_id, url): the unit of ordering
    event: str
    delivery_id: str
    body: bytes
    created: float  # monotonic
    attempts: int = 0
    due: float = 0.0  # monotonic time of the next attempt
    retry_after: float | None = None  # seconds the last answer's Retry-After asked for


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` header value asks for: delta-seconds or an HTTP date
    (RFC 9110 10.2.3); None when absent or unreadable (the back-off applies alone)."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # not an HTTP date (those are GMT)
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class Outcome:
    DELIVERED, RETRY, GIVE_UP = "delivered", "retry", "give up"


class Notifier:
    """Delivers webhook events of every job of this process; see the module docstring."""

    def __init__(self, settings: Settings | None = None, resolver: Resolver = resolve) -> None:
        self.settings = settings or get_settings()
        self.policy = UrlPolicy.from_settings(self.settings)
        self.resolver = resolver
        self.items: queue.Queue[Delivery | None] = queue.Queue(maxsize=self.settings.webhook_queue)
        self.stop = threading.Event()
        self.dropped = 0  # events lost to a full queue
        self.sent = 0  # events delivered (2xx)
        self.given_up = 0  # events that exhausted their attempts or were refused
        self._channels: dict[tuple[str, str], deque[Delivery]] = {}
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="framefleet-webhooks", daemon=True)
        self._thread.start()

    def for_job(self, spec: JobSpec, attempt: int = 0) -> JobEvents:
        """The events of one run of ``spec`` (a no-op when it asks for none)."""
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
        return JobEvents(self, spec, attempt, targets)

    def submit(self, delivery: Delivery) -> None:
        """Enqueue without blocking; a full queue drops the event."""
        if self._closing:
            return
        try:
            self.items.put_nowait(delivery)
        except queue.Full:
            self.dropped += 1
            log.error("webhook queue full (%d): %s event of job %s dropped",
                      self.items.maxsize, delivery.event, delivery.channel[0])

    def close(self, timeout: float) -> bool:
        """Deliver what is pending for at most ``timeout`` s, then stop; True if all went."""
        self._closing = True
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.items.put(None, timeout=max(0.01, deadline - time.monotonic()))
                break
            except queue.Full:
                if time.monotonic() >= deadline:
                    break
        self._thread.join(max(0.0, deadline - time.monotonic()))
        clean = not self._thread.is_alive()
        self.stop.set()
        self._thread.join(1.0)
        pending = sum(len(c) for c in self._channels.values()) + self.items.qsize()
        if pending:
            log.warning("webhooks: %d events not delivered at shutdown", pending)
        return clean and not pending

    # -- the delivery thread ---------------------------------------------------------------

    def _run(self) -> None:
        ended = False
        while not self.stop.is_set():
            now = time.monotonic()
            heads = [c[0].due for c in self._channels.values()]
            wait = min([0.2, *(max(0.0, due - now) for due in heads)])
            if not ended:
                try:
                    item = self.items.get(timeout=wait)
                    if item is None:
                        ended = True
                    else:
                        self._channels.setdefault(item.channel, deque()).append(item)
                except queue.Empty:
                    pass
            elif not self._channels:
                return
            else:
                time.sleep(wait)
            self._deliver_due()

    def _deliver_due(self) -> None:
        for key in list(self._channels):
            channel = self._channels[key]
            while channel and channel[0].due <= time.monotonic() and not self.stop.is_set():
                delivery = channel[0]
                outcome = self._attempt(delivery)
                delay = max(self._backoff(delivery.attempts), delivery.retry_after or 0.0)
                if outcome == Outcome.RETRY and self._may_retry(delivery, delay):
                    delivery.due = time.monotonic() + delay
                    break
                channel.popleft()
                if outcome == Outcome.DELIVERED:
                    self.sent += 1
                else:
                    self.given_up += 1
                    log.error("webhook %s (%s) of job %s to %s given up after %d attempt(s)",
                              delivery.delivery_id, delivery.event, key[0], key[1],
                              delivery.attempts)
            if not channel:
                del self._channels[key]

    def _may_retry(self, delivery: Delivery, delay: float) -> bool:
        s = self.settings
        age = time.monotonic() - delivery.created + delay
        if delivery.attempts < s.webhook_max_attempts and age > s.webhook_max_age_s:
            log.warning("webhook to %s: next attempt in %.0f s would pass "
                        "FRAMEFLEET_WEBHOOK_MAX_AGE_S=%.0f", delivery.target.url, delay,
                        s.webhook_max_age_s)
        return delivery.attempts < s.webhook_max_attempts and age <= s.webhook_max_age_s

    def _backoff(self, attempts: int) -> float:
        s = self.settings
        return float(min(s.webhook_backoff_max_s, s.webhook_backoff_s * 2 ** (attempts - 1)))

    def _attempt(self, delivery: Delivery) -> str:
        """One POST; never raises."""
        delivery.attempts += 1
        delivery.retry_after = None
        target = delivery.target
        try:
            addresses = self.resolver(target.host, target.port)
            if not addresses:
                raise OSError(f"{target.host}: no address")
            for addr in addresses:
                self.policy.check_address(addr, target.url)
        except InvalidJobError as e:
            log.error("webhook to %s refused after DNS: %s", target.url, e)
            return Outcome.GIVE_UP
        except OSError as e:
            log.warning("webhook to %s: %s (attempt %d)", target.url, e, delivery.attempts)
            return Outcome.RETRY
        timestamp = int(time.time())
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            EVENT_HEADER: delivery.event,
            DELIVERY_HEADER: delivery.delivery_id,
            TIMESTAMP_HEADER: str(timestamp),
            SIGNATURE_HEADER: signature(self._secret(), timestamp, delivery.body),
        }
        last: Exception | None = None
        for addr in addresses:  # the first address that accepts a connection gets it
            kind = _PinnedHTTPS if target.scheme == "https" else _PinnedHTTP
            conn = kind(target.host, target.port, addr, self.settings.webhook_timeout_s)
            try:
                conn.request("POST", target.path, body=delivery.body, headers=headers)
                response = conn.getresponse()
                response.read(64 * 1024)  # bounded: the answer's body is not ours to keep
                status = response.status
                delivery.retry_after = retry_after_s(response.getheader("Retry-After"))
            except (OSError, http.client.HTTPException) as e:
                last = e
                continue
            finally:
                conn.close()
            return self._judge(delivery, status)
        log.warning("webhook to %s: %s (attempt %d)", target.url, last, delivery.attempts)
        return Outcome.RETRY

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
        self, notifier: Notifier, spec: JobSpec, attempt: int, targets: list[Target]
    ) -> None:
        self.notifier = notifier
        self.spec = spec
        self.attempt = attempt
        self.targets = targets
        self.events: set[str] = set(spec.notify.events) if spec.notify is not None else set()
        self.sequence = 0
        self._lock = threading.Lock()  # segment events come from encoder threads

    def emit(self, event: NotifyEvent, data: dict[str, Any]) -> None:
        """Send ``event`` with ``data`` to every URL of the job that asked for it."""
        if event not in self.events or not self.targets:
            return
        try:
            with self._lock:
                self.sequence += 1
                delivery_id = uuid.uuid4().hex
                body = json.dumps({
                    "id": delivery_id, "event": event, "job_id": self.spec.job_id,
                    "tenant": self.spec.tenant, "attempt": self.attempt,
                    "sequence": self.sequence, "created_at": time.time(), "data": data,
                }, separators=(",", ":")).encode()
                now = time.monotonic()
                for target in self.targets:
                    self.notifier.submit(Delivery(
                        target, (self.spec.key, target.url), event, delivery_id, body, now,
                    ))
        except Exception:  # a notification must never fail the job
            log.exception("job %s: %s event not sent", self.spec.job_id, event)

    def started(self, node: str) -> None:
        self.emit("started", {"worker": node, "spec_digest": self.spec.digest()})

    def segment(self, seg: SegmentInfo, progress: Progress) -> None:
        """Segment ``seg`` joined the live playlist (a ``Run.segment_hooks`` entry)."""
        self.emit("segment", {"segment": seg.model_dump(mode="json"),
                              "progress": progress.model_dump(mode="json"),
                              "playlist_uri": f"{self.spec.output_prefix}/{PLAYLIST}"})

    def succeeded(self, result: JobResult) -> None:
        self.emit("succeeded", {"result": result.model_dump(mode="json")})

    def failed(self, error: BaseException) -> None:
        if not isinstance(error, Exception):
            return  # SystemExit, KeyboardInterrupt: the worker stops, the job is redelivered
        self.emit("failed", {"error": {"type": type(error).__name__, "message": str(error)}})

    def cancelled(self, message: str) -> None:
        self.emit("cancelled", {"message": message})


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
