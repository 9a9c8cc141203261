"""The webhook deliveries of one worker process: a bounded backlog, one lane per receiver, and
a bounded pool of delivery threads.

**Lanes.** A receiver is a (scheme, host, port). Each has a lane, and a lane is served by one
thread at a time, so one receiver gets one request at a time, in the order its events were
emitted. Different receivers are served side by side by ``FRAMEFLEET_WEBHOOK_THREADS``
threads: a receiver that is slow, or trickles its answer, holds one thread for at most one
attempt's deadline and never delays another receiver's events (unless every thread is held by
a distinct slow receiver at once).

**Channels.** Inside a lane, the events of one URL of one job form a channel: an event that
failed holds its channel's later events back until it is delivered or given up (order per
URL), while the lane serves other channels' due events in the meantime instead of idling
through a back-off.

**Backlog.** ``submit`` never blocks: past ``FRAMEFLEET_WEBHOOK_QUEUE`` events waiting in the
process, an event is dropped (logged), as a full queue did before.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from producer.settings import Settings
from producer.webhooks.rules import Target

log = logging.getLogger(__name__)


class Outcome:
    DELIVERED, RETRY, GIVE_UP = "delivered", "retry", "give up"


_order = itertools.count()


@dataclass
class Delivery:
    """One event for one URL, retried until delivered or given up."""

    target: Target
    channel: tuple[str, str]  # (job key, url): the unit of ordering across retries
    event: str
    delivery_id: str
    body: bytes
    created: float  # monotonic
    attempts: int = 0
    due: float = 0.0  # monotonic time of the next attempt
    retry_after: float | None = None  # seconds the last answer's Retry-After asked for
    #: Asked before each attempt: False (the run lost its job's lease) gives the event up.
    may_send: Callable[[], bool] | None = None
    event_id: str = ""
    order: int = field(default_factory=lambda: next(_order))  # emission order


class _Lane:
    """The channels of one receiver; ``busy`` while a thread delivers one of its events."""

    def __init__(self) -> None:
        self.channels: dict[tuple[str, str], deque[Delivery]] = {}
        self.busy = False

    def head(self, now: float) -> Delivery | None:
        """The next event to send: the earliest-emitted of the channels' heads that are due,
        else the head due soonest."""
        heads = [c[0] for c in self.channels.values()]
        due = [d for d in heads if d.due <= now]
        if due:
            return min(due, key=lambda d: d.order)
        return min(heads, key=lambda d: d.due) if heads else None

    def pending(self) -> int:
        return sum(len(c) for c in self.channels.values())


Attempt = Callable[[Delivery], str]


class DeliveryPool:
    """Lanes and threads (see the module docstring); ``attempt`` makes one try, never raises,
    and returns an :class:`Outcome` (setting ``delivery.retry_after`` if asked)."""

    def __init__(self, settings: Settings, attempt: Attempt) -> None:
        self.settings = settings
        self._attempt = attempt
        self.cond = threading.Condition()
        self.lanes: dict[tuple[str, str, int], _Lane] = {}
        self.waiting = 0  # events in the lanes, in flight included
        self.dropped = 0  # events lost to a full backlog
        self.sent = 0  # events delivered (2xx)
        self.given_up = 0  # events that exhausted their attempts or were refused
        self.closing = False
        self.stopped = False
        self.threads = [
            threading.Thread(target=self._serve, name=f"framefleet-webhooks-{i}", daemon=True)
            for i in range(settings.webhook_threads)
        ]
        for thread in self.threads:
            thread.start()

    def submit(self, delivery: Delivery) -> None:
        """Add to the receiver's lane without blocking; past the backlog limit, drop it."""
        with self.cond:
            if self.closing:
                return
            if self.waiting >= self.settings.webhook_queue:
                self.dropped += 1
                log.error("webhook queue full (%d): %s event of job %s dropped",
                          self.settings.webhook_queue, delivery.event, delivery.channel[0])
                return
            lane = self.lanes.setdefault(delivery.target.receiver, _Lane())
            lane.channels.setdefault(delivery.channel, deque()).append(delivery)
            self.waiting += 1
            self.cond.notify()

    def close(self, timeout: float) -> bool:
        """Deliver what is pending for at most ``timeout`` s, then stop; True if all went."""
        deadline = time.monotonic() + timeout
        with self.cond:
            self.closing = True
            self.cond.notify_all()
            while self.waiting and time.monotonic() < deadline:
                self.cond.wait(min(0.2, max(0.0, deadline - time.monotonic())))
            self.stopped = True
            self.cond.notify_all()
            pending = self.waiting
        for thread in self.threads:  # a thread inside an attempt ends with its deadline
            thread.join(max(0.05, deadline - time.monotonic()))
        if pending:
            log.warning("webhooks: %d events not delivered at shutdown", pending)
        return not pending

    # -- the delivery threads ------------------------------------------------------------

    def _take(self) -> tuple[_Lane, Delivery] | None:
        """Wait for a due event of a lane no other thread serves; mark the lane busy."""
        with self.cond:
            while not self.stopped:
                now = time.monotonic()
                wait = 0.2
                for lane in self.lanes.values():
                    head = None if lane.busy else lane.head(now)
                    if head is None:
                        continue
                    if head.due <= now:
                        lane.busy = True
                        return lane, head
                    wait = min(wait, head.due - now)
                if self.closing and not self.waiting:
                    return None
                self.cond.wait(wait)
            return None

    def _serve(self) -> None:
        while (taken := self._take()) is not None:
            lane, delivery = taken
            try:
                outcome = self._attempt(delivery)
            except Exception:  # a bug here must not leave the lane busy forever
                log.exception("webhook %s to %s", delivery.delivery_id, delivery.target.url)
                outcome = Outcome.GIVE_UP
            delay = max(self._backoff(delivery.attempts), delivery.retry_after or 0.0)
            retry = outcome == Outcome.RETRY and self._may_retry(delivery, delay)
            with self.cond:
                if retry:
                    delivery.due = time.monotonic() + delay
                else:
                    self._finish(lane, delivery, outcome)
                lane.busy = False
                self.cond.notify_all()

    def _finish(self, lane: _Lane, delivery: Delivery, outcome: str) -> None:
        """Take a delivered or given-up event off its channel (the lock is held)."""
        channel = lane.channels[delivery.channel]
        channel.popleft()
        if not channel:
            del lane.channels[delivery.channel]
        if not lane.channels:
            self.lanes.pop(delivery.target.receiver, None)
        self.waiting -= 1
        if outcome == Outcome.DELIVERED:
            self.sent += 1
        else:
            self.given_up += 1
            log.error("webhook %s (%s) of job %s to %s given up after %d attempt(s)",
                      delivery.delivery_id, delivery.event, delivery.channel[0],
                      delivery.target.url, delivery.attempts)

    def _may_retry(self, delivery: Delivery, delay: float) -> bool:
        s = self.settings
        if self.stopped:
            return False
        age = time.monotonic() - delivery.created + delay
        if delivery.attempts < s.webhook_max_attempts and age > s.webhook_max_age_s:
            log.warning("webhook to %s: next attempt in %.0f s would pass "
                        "FRAMEFLEET_WEBHOOK_MAX_AGE_S=%.0f", delivery.target.url, delay,
                        s.webhook_max_age_s)
        return delivery.attempts < s.webhook_max_attempts and age <= s.webhook_max_age_s

    def _backoff(self, attempts: int) -> float:
        s = self.settings
        return float(min(s.webhook_backoff_max_s, s.webhook_backoff_s * 2 ** (attempts - 1)))
