"""Host-loss recovery: a job whose host vanished runs again within seconds, exactly once.

kombu's Redis transport keeps every delivered, not yet acknowledged message in the hash
``unacked`` (delivery tag → message) and its delivery time in the sorted set ``unacked_index``;
it puts a message back on its queue only once it is older than the visibility timeout, which
must exceed the longest job (hours). A host that dies without a word (power loss, a spot
reclaim with no notice, a kernel panic) therefore stalled its job for hours.

Two small duties, run by a thread of every worker's main process, fix that:

- **touch**: every ``FRAMEFLEET_RECOVERY_PERIOD_S`` the worker sets the ``unacked_index`` time
  of every message it holds (running, or waiting for its countdown) to now (``ZADD XX``: an
  acknowledged message is not brought back). A live worker's messages always look fresh.
- **sweep**: messages of ``framefleet.decode_video`` untouched for ``FRAMEFLEET_RECOVERY_GRACE_S``
  are restored to their queue by one Lua script, a compare-and-set on everything that says
  the job is orphaned: the ``unacked`` entry is still the one read (``HDEL`` succeeds once),
  its time is still older than the grace, the job's lease is absent (it lives 10 s unless its
  run renews it), its claim names this spec, and its result is not final (``producer.state.keys``:
  ``RESTORE``). The script also writes the state ``REQUEUED`` with the reason, which the next
  worker's STARTED and PROGRESS overwrite.
  A message whose job is already final (its worker died between the result and the ack) is
  acknowledged instead: kombu would deliver it again hours later.

With the defaults (a round every 2 s, a grace of 10 s: one job lease) a lost host's job is
requeued about one lease after its last sign of life, plus at most one round. A live host is
never taken for lost on a single signal: its main process touches the message, its pool
process renews the lease, and both must have stopped. A sweeper does not sweep for one grace
after a round of its own that failed (Redis away: every worker's touches failed alike, and
they need a round to touch again) or came late (this process was stopped or starved, and the
others on its host may have been too).

kombu's own restore (after the visibility timeout) runs ``HGET``, then ``HDEL`` and a push in
``MULTI``, under ``WATCH unacked``: whichever of the two changes the entry first wins, the
other finds it gone, so several sweepers and kombu together restore a message at most once.

The lease and claim live in the result backend's Redis; the script needs them and the broker's
keys on one server (another database of it is fine: the script SELECTs it). With the broker and
the results on two servers, no sweep runs (a warning says so; ``framefleet doctor`` too) and a
lost host's jobs come back after the visibility timeout, as before.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import redis

from producer.app import TASK_NAME
from producer.settings import Settings, get_settings
from producer.state import keys
from producer.state.broker import REDIS_SCHEMES, redis_client, same_server, server_identity

log = logging.getLogger(__name__)

REQUEUED = "REQUEUED"
SWEEP_LIMIT = 100
SWEEP_PAGES = 10

def _db(client: redis.Redis) -> int:
    return int(client.connection_pool.connection_kwargs.get("db") or 0)


def spec_digest(payload: dict[str, Any]) -> tuple[str, str] | None:
    """(job key, spec digest) of a kombu message of ``framefleet.decode_video`` whose spec is
    the job its task id names; None if not."""
    from producer.wire.spec import parse_spec

    headers = payload.get("headers") or {}
    if headers.get("task") != TASK_NAME or not headers.get("id"):
        return None
    try:
        body = payload["body"]
        if (payload.get("properties") or {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        spec = parse_spec(args[0])
    except Exception:  # noqa: BLE001 - not a job a worker would run: left to kombu
        return None
    if spec.key != str(headers["id"]):
        return None  # not the job its id names: a worker drops it, kombu may restore it
    return spec.key, spec.digest()


@dataclass(frozen=True)
class Outcome:
    tag: str
    job_id: str | None
    verdict: str
    age_s: float


class Sweeper:
    """Restores orphaned framefleet jobs of one broker (see the module docstring).

    ``destination(payload, exchange, routing_key)`` names the list kombu would push the
    message back to (:func:`kombu_destination` for a kombu channel).
    """

    def __init__(self, broker: redis.Redis, backend: redis.Redis,
                 destination: Callable[[dict[str, Any], str, str], str | None],
                 grace_s: float, result_ttl_s: int | None, node: str,
                 meta_key: Callable[[str], str] = keys.result,
                 unacked_key: str = keys.UNACKED,
                 unacked_index_key: str = keys.UNACKED_INDEX) -> None:
        if server_identity(broker) != server_identity(backend):
            raise ValueError("broker and result backend are on different Redis servers")
        self.r = broker
        self.backend = backend
        self.backend_db = "" if _db(backend) == _db(broker) else str(_db(backend))
        self.broker_db = str(_db(broker))
        self.destination = destination
        self.grace_s = grace_s
        self.ttl = result_ttl_s
        self.node = node
        self.meta_key = meta_key
        self.unacked, self.index = unacked_key, unacked_index_key
        self._restore = broker.register_script(keys.RESTORE)
        self.kombu_connection: Any = None

    def now(self) -> float:
        """Redis's clock: every worker touches and sweeps by the same one, whatever the hosts'
        clocks say (kombu stamps a delivery with its consumer's clock)."""
        seconds, micros = self.r.time()
        return float(seconds) + float(micros) / 1e6

    def touch(self, tags: Iterable[str], now: float | None = None) -> int:
        """Mark the messages this worker holds as alive; returns how many were still held."""
        tags = list(tags)
        if not tags:
            return 0
        now = self.now() if now is None else now
        changed: Any = self.r.zadd(self.index, dict.fromkeys(tags, now), xx=True, ch=True)
        return int(changed)

    def sweep(self, now: float | None = None) -> list[Outcome]:
        """One pass over the messages untouched for the grace period."""
        now = self.now() if now is None else now
        ceil = now - self.grace_s
        outcomes: list[Outcome] = []
        for start in range(0, SWEEP_PAGES * SWEEP_LIMIT, SWEEP_LIMIT):
            # Oldest first; a page at a time, so that messages left alone (not framefleet's,
            # unclaimed) cannot hide newer orphans behind them.
            stale: Any = self.r.zrangebyscore(self.index, "-inf", ceil, start=start,
                                              num=SWEEP_LIMIT, withscores=True)
            outcomes += [o for tag, score in stale
                         if (o := self._one(_text(tag), float(score), now, ceil)) is not None]
            if len(stale) < SWEEP_LIMIT:
                break
        return outcomes

    def _one(self, tag: str, score: float, now: float, ceil: float) -> Outcome | None:
        entry = self.r.hget(self.unacked, tag)
        if entry is None:
            return None
        try:
            payload, exchange, routing_key = json.loads(entry)
        except (ValueError, TypeError):
            return None
        job = spec_digest(payload) if isinstance(payload, dict) else None
        if job is None:
            return None  # not a framefleet job: kombu's visibility timeout handles it
        job_id, digest = job
        queue = self.destination(payload, exchange, routing_key)
        if queue is None:
            return Outcome(tag, job_id, "no-queue", now - score)
        payload["headers"]["redelivered"] = True
        payload["properties"].setdefault("delivery_info", {})["redelivered"] = True
        verdict = self._restore(
            keys=[self.unacked, self.index, queue, keys.lease(job_id), keys.claim(job_id),
                  self.meta_key(job_id)],
            args=[tag, entry, repr(ceil), json.dumps(payload), self.backend_db, self.broker_db,
                  digest, self._requeued_meta(job_id, now - score),
                  "" if self.ttl is None else str(int(self.ttl))],
        )
        outcome = Outcome(tag, job_id, _text(verdict), now - score)
        if outcome.verdict == "restored":
            log.warning("job %s requeued by %s: its worker held it unacknowledged and untouched "
                        "for %.0f s, with no live lease (host lost)", job_id, self.node,
                        outcome.age_s)
        return outcome

    def _requeued_meta(self, job_id: str, age_s: float) -> str:
        old = self.backend.get(self.meta_key(job_id))
        lost = None
        if old is not None:
            try:
                lost = json.loads(old).get("worker")
            except (ValueError, AttributeError):
                lost = None
        reason = (f"requeued after its worker {lost or '(unknown)'} was lost: no lease renewed "
                  f"and the message untouched for {age_s:.0f} s")
        return json.dumps({
            "status": REQUEUED, "task_id": job_id, "traceback": None, "children": [],
            "date_done": None,
            "result": {"reason": reason, "lost_worker": lost, "requeued_by": self.node,
                       "requeued_at": time.time()},
        })


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def kombu_destination(channel: Any) -> Callable[[dict[str, Any], str, str], str | None]:
    """The list kombu's own restore pushes a message to (``Channel._do_restore_message``)."""

    def destination(payload: dict[str, Any], exchange: str, routing_key: str) -> str | None:
        queues = list(channel._lookup(exchange, routing_key))
        if len(queues) != 1:
            return None
        priority = channel._get_message_priority(payload, reverse=False)
        return str(channel._q_for_pri(queues[0], priority))

    return destination


def held_tags() -> list[str]:
    """Delivery tags of the messages this worker holds: running, reserved or waiting (ETA)."""
    from celery.worker import state

    for _ in range(3):
        try:
            requests = list(state.requests.values())
            break
        except RuntimeError:  # changed size while copied: copy again
            continue
    else:
        return []
    return [str(r.message.delivery_tag) for r in requests
            if getattr(r, "message", None) is not None and r.message.delivery_tag]


class RecoveryThread(threading.Thread):
    """Touch, then sweep, every ``period_s``; errors are logged and the next round goes on.

    After a round that failed, or one that started more than half a grace after the one before
    (this process stopped or starved), it touches but does not sweep for one grace: the other
    workers get the time to touch their messages again before anyone judges them.
    """

    def __init__(self, sweeper: Sweeper, period_s: float,
                 held: Callable[[], list[str]] = held_tags,
                 clock: Callable[[], float] = time.monotonic,
                 reconcile: Callable[[], object] | None = None) -> None:
        super().__init__(name="framefleet-recovery", daemon=True)
        self.sweeper, self.period_s, self.held = sweeper, period_s, held
        self.reconcile = reconcile  # lost messages (worker.lifecycle.reconcile), each round
        self.clock = clock
        self.late_s = sweeper.grace_s / 2
        self.stop_event = threading.Event()
        self._last: float | None = None
        self._hold_until = 0.0
        self._failing = False

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.round()
            if self.reconcile is not None:
                try:
                    self.reconcile()
                except Exception as e:  # noqa: BLE001 - judged again next round
                    log.warning("lost-message reconciler: %s", e)
            self.stop_event.wait(self.period_s)

    def round(self) -> None:
        """One touch and, unless held off, one sweep."""
        now = self.clock()
        if self._last is not None and now - self._last > self.late_s:
            self._hold(now)
            if not self._failing:  # a failing round is slow by itself (Redis away)
                log.warning("host-loss sweep held off for %.0f s: this round came %.1f s after "
                            "the last one (process stopped or starved)", self.sweeper.grace_s,
                            now - self._last)
        self._last = now
        try:
            self.sweeper.touch(self.held())
            if now >= self._hold_until:
                self.sweeper.sweep()
        except Exception as e:  # noqa: BLE001 - a sweeper must never take a worker down
            self._hold(self.clock())
            if not self._failing:  # once per outage, not every round
                log.warning("host-loss sweep failed: %s; again every %.0f s, no sweep until "
                            "%.0f s after a round succeeds", e, self.period_s,
                            self.sweeper.grace_s)
            self._failing = True
            return
        if self._failing:
            log.info("host-loss sweep: Redis answers again")
            self._failing = False

    def _hold(self, now: float) -> None:
        self._hold_until = now + self.sweeper.grace_s

    def stop(self) -> None:
        self.stop_event.set()


def sweeper_for(app: Any, node: str, settings: Settings | None = None) -> Sweeper | None:
    """A Sweeper for ``app``'s broker and result backend, or None (with the reason logged)."""
    s = settings or get_settings()
    broker_url = str(app.conf.broker_url or "")
    backend_url = s.backend_url if app.conf.result_backend is None else str(
        app.conf.result_backend)
    options = dict(app.conf.broker_transport_options or {})
    if not broker_url.startswith(REDIS_SCHEMES):
        return None  # embedded mode, or not Redis: nothing of kombu's Redis ack emulation
    if options.get("global_keyprefix"):
        log.warning("host-loss sweep off: global_keyprefix is not supported")
        return None
    if not same_server(broker_url, backend_url):
        log.warning("host-loss sweep off: broker and result backend are on different Redis "
                    "servers; a lost host's jobs come back after the visibility timeout (%d s)",
                    s.visibility_timeout)
        return None
    conn = app.connection_for_write()
    channel = conn.default_channel
    broker = redis_client(broker_url, s, socket_timeout=10, socket_connect_timeout=5)
    backend = redis_client(backend_url, s, socket_timeout=10, socket_connect_timeout=5)
    backend_app = app.backend

    def meta_key(job_id: str) -> str:
        return _text(backend_app.get_key_for_task(job_id))

    sweeper = Sweeper(broker, backend, kombu_destination(channel), s.recovery_grace_s,
                      getattr(backend_app, "expires", None), node, meta_key,
                      channel.unacked_key, channel.unacked_index_key)
    sweeper.kombu_connection = conn  # the channel that names the queues lives as long
    return sweeper


_thread: RecoveryThread | None = None


def start(app: Any, node: str, settings: Settings | None = None) -> RecoveryThread | None:
    """Start this worker's touch-and-sweep thread (call once, in the main process)."""
    global _thread
    s = settings or get_settings()
    if s.recovery_period_s == 0 or _thread is not None:
        return _thread
    try:
        sweeper = sweeper_for(app, node, s)
    except Exception as e:  # noqa: BLE001 - a broker away at start must not stop the worker
        log.warning("host-loss sweep not started: %s", e)
        return None
    if sweeper is None:
        return None
    reconcile = None
    if s.reconcile_after_s:
        from worker.lifecycle.reconcile import Reconciler, app_sender

        reconcile = Reconciler(sweeper.r, sweeper.backend, s.reconcile_after_s, node,
                               app_sender(app), sweeper.meta_key,
                               unacked_key=sweeper.unacked).round
    _thread = RecoveryThread(sweeper, s.recovery_period_s, reconcile=reconcile)
    _thread.start()
    log.info("host-loss sweep every %.0f s (grace %.0f s) on %s; lost messages sent again "
             "after %s", s.recovery_period_s, s.recovery_grace_s, node,
             f"{s.reconcile_after_s:.0f} s" if s.reconcile_after_s else "never (off)")
    return _thread


def stop() -> None:
    global _thread
    if _thread is not None:
        _thread.stop()
        _thread = None
