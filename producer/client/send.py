"""The one way a job's message is put on the queue: the client's submit and the worker's
lost-message reconciler (``worker.lifecycle.reconcile``) send the same message.

A submit first claims the job's key, then sends its message. A broker that does not answer the
claim fails the submit at once, naming it: nothing was claimed, nothing queued, and the same
submit may simply be made again (``producer.client.connection``); so does a broker of its own
(not the results' server) that never answered this client. A broker that answered (the
claim, on the one Redis the fleet runs both on, or an earlier message) and then stops
answering (a Redis failover, a restart) is waited for here, up to
``FRAMEFLEET_WAIT_OUTAGE_S`` (the bound ``wait`` rides an outage out for), saying so once: the
job is claimed, and its message goes out as soon as the broker answers again. kombu alone
gave up after its ``broker_connection_timeout`` and one retry (about 4 s), which left the job
claimed with no message. Past the bound the error says so; the same spec submitted again sends
the message then (``Client.submit``: a claim that was never sent is sent).

A message sent twice (a publish that landed, whose answer was lost) is harmless: a worker
that receives a copy of a job that ended drops it, and one of a job that runs waits for its
lease.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from celery import Celery

from producer.app import ENQUEUED_AT_HEADER, TASK_NAME, redis_priority
from producer.client.connection import address, classify
from producer.errors import BrokerAuthError, BrokerUnavailable
from producer.settings import Settings
from producer.state.broker import same_server
from producer.wire.rules import time_limits
from producer.wire.spec import JobSpec

log = logging.getLogger(__name__)
#: Pause between two sends while the broker does not answer (each send itself takes up to
#: kombu's connection timeout).
PAUSE_S = 0.5
#: Set on an app once a message went out through its broker.
ANSWERED = "framefleet_broker_answered"


def send_job(app: Celery, spec: JobSpec, payload: dict[str, Any], settings: Settings,
             batch: Any = None, declare: bool = True,
             say: Callable[[str], None] | None = None) -> None:
    """Send ``spec`` (``payload``: its JSON form) as the task of id ``spec.key``, with its
    priority and time limits (``producer.wire.rules.time_limits``: the worker sets them again
    from the spec and its own settings). A broker that does not answer is waited for up to
    ``FRAMEFLEET_WAIT_OUTAGE_S``, said once to ``say`` (default: this module's log) and once
    more when it answers; then ``BrokerUnavailable`` naming it and the job.

    ``batch``: a bulk submit's kombu producer, inside its ``batch()``: the publish is only
    buffered (the batch's pipeline sends it, and fails as a whole), so it is not retried
    alone; ``declare=False``: the queue was declared by the batch's first message."""
    if batch is not None:
        _publish(app, spec, payload, settings, {"producer": batch, "retry": False,
                                                **({} if declare else {"declare": []})})
        return
    say = say or log.warning
    bound = settings.wait_outage_s
    broker = str(app.conf.broker_url)
    since: float | None = None
    while True:
        try:
            _publish(app, spec, payload, settings, {})
        except Exception as e:
            err = classify(e, broker, str(app.conf.result_backend or broker))
            if err is None or isinstance(err, BrokerAuthError):
                raise
            now = time.monotonic()
            if since is None:
                if not _answered(app, settings):
                    raise err from e  # a wrong URL, not a failover: say so at once
                since = now
                say(f"{err}: job {spec.key} is claimed, its message not sent yet; waiting up "
                    f"to {bound:g} s for the broker at {address(broker)} to answer "
                    "(FRAMEFLEET_WAIT_OUTAGE_S)")
            if now - since >= bound:
                raise BrokerUnavailable(
                    f"{err} (no answer for {now - since:.0f} s, FRAMEFLEET_WAIT_OUTAGE_S="
                    f"{bound:g}): job {spec.key} is claimed but not queued; submit the same "
                    "spec again once the broker answers, and it is queued then") from e
            time.sleep(PAUSE_S)
            continue
        setattr(app, ANSWERED, True)
        if since is not None:
            say(f"job {spec.key}: the broker at {address(broker)} answered again after "
                f"{time.monotonic() - since:.1f} s; queued")
        return


def _answered(app: Celery, settings: Settings) -> bool:
    """Whether the broker has answered this client: a message went out through it before, or
    it is the server that answered the claim a moment ago (the broker and the results on one
    Redis, as the fleet runs them)."""
    conf = app.conf
    broker, backend = str(conf.broker_url), str(conf.result_backend or conf.broker_url)
    return bool(getattr(app, ANSWERED, False)) or same_server(broker, backend, settings)


def _publish(app: Celery, spec: JobSpec, payload: dict[str, Any], settings: Settings,
             options: dict[str, Any]) -> None:
    hard, soft = time_limits(payload, settings)
    app.send_task(
        TASK_NAME,
        **options,
        args=[payload],
        task_id=spec.key,
        priority=redis_priority(spec.priority),
        soft_time_limit=soft,
        time_limit=hard,
        # Events and logs name the job, not its whole spec (and not its URIs).
        argsrepr=f"[<JobSpec {spec.key}>]",
        kwargsrepr="{}",
        headers={ENQUEUED_AT_HEADER: time.time()},  # queue wait and oldest age
    )
