"""The client's connections to Redis: bounded waits, and one-line errors when they fail.

A worker waits out a Redis restart (the app factory retries the result backend 20 times);
a person at a terminal must not wait for a broker that is not there. A submit that meets a
broker that does not answer its first command fails at once, naming it: nothing was claimed
or queued. One whose broker stops answering after the claim waits for it (``send_job``), so
that a claimed job gets its message. ``bound_client_app`` gives a client's app short connect and
read timeouts and a short retry budget on the broker (publish) and the result backend, so a
broker that is down, refuses the password or wants one fails a command within a few
seconds. ``broker_errors`` turns what redis-py, kombu and Celery raise then into
``BrokerUnavailable`` / ``BrokerAuthError``: one line naming the URL (password masked) and
the cause.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlparse

from celery import Celery
from kombu.utils.url import maybe_sanitize_url

from producer.errors import BrokerAuthError, BrokerError, BrokerUnavailable, FramefleetError

#: Seconds a client waits for a TCP connection to Redis, and for one reply.
CONNECT_TIMEOUT_S = 2.0
REPLY_TIMEOUT_S = 10.0


def bound_client_app(app: Celery) -> None:
    """Short timeouts and retries for a client's ``app``; call before its backend is used
    (Celery reads these when it creates the backend)."""
    conf = app.conf
    redis_urls = ("redis://", "rediss://", "sentinel://")
    if str(conf.broker_url or "").startswith(redis_urls):
        transport = dict(conf.broker_transport_options or {})
        transport.update(socket_connect_timeout=CONNECT_TIMEOUT_S,
                         socket_timeout=REPLY_TIMEOUT_S)
        conf.update(
            broker_transport_options=transport,
            broker_connection_timeout=CONNECT_TIMEOUT_S,
            broker_connection_max_retries=1,
            task_publish_retry_policy={"max_retries": 1, "interval_start": 0,
                                       "interval_step": 0.5, "interval_max": 1},
        )
    # The embedded mode's sqlite backend keeps the factory's patient retries (a locked
    # database is a blip there, not a misconfiguration).
    if str(conf.result_backend or conf.broker_url or "").startswith(redis_urls):
        conf.update(
            redis_socket_connect_timeout=CONNECT_TIMEOUT_S,
            redis_socket_timeout=REPLY_TIMEOUT_S,
            # One quick retry rides out a blip; the worker's 20 would hold a terminal a
            # minute.
            result_backend_always_retry=True,
            result_backend_max_retries=1,
            result_backend_base_sleep_between_retries_ms=100,
            result_backend_max_sleep_between_retries_ms=500,
        )


def mask(url: str) -> str:
    """``url`` with its password replaced by ``**`` (kombu's sanitiser)."""
    return str(maybe_sanitize_url(url))


def address(url: str) -> str:
    """Where ``url`` points, for a person: ``host:port`` (Redis's 6379 when the URL has none;
    the database when not 0), never the password; the masked URL for anything else (the
    embedded mode's sqlite, a sentinel list)."""
    parsed = urlparse(url)
    if parsed.scheme not in ("redis", "rediss") or not parsed.hostname:
        return mask(url)
    try:
        port = parsed.port or 6379
    except ValueError:
        return mask(url)
    host = f"[{parsed.hostname}]" if ":" in parsed.hostname else parsed.hostname
    db = parsed.path.strip("/")
    return f"{host}:{port}" + (f" db {db}" if db not in ("", "0") else "")


def _chain(e: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def classify(e: BaseException, broker_url: str, backend_url: str) -> BrokerError | None:
    """The ``BrokerError`` that ``e`` means, or None when it is not a connection failure."""
    import redis.exceptions as rx
    from kombu.exceptions import OperationalError

    chain = list(_chain(e))
    # Said already (a send that waited for the broker, then a clean-up that failed too): the
    # first words are the ones that say what happened to the job.
    said = [x for x in chain if isinstance(x, BrokerError)]
    if said:
        return type(said[-1])(str(said[-1]))
    # A publish failure comes wrapped in kombu's OperationalError: the broker's; the rest
    # (registry, states, results) is the result backend's.
    broker = any(isinstance(x, OperationalError) for x in chain)
    role, url = ("broker", broker_url) if broker else ("result backend", backend_url)
    where = f"{role} {mask(url)}"
    for x in chain:
        if isinstance(x, rx.AuthenticationError) or (
            isinstance(x, rx.ResponseError) and str(x).startswith(("NOAUTH", "WRONGPASS"))
        ):
            if urlparse(url).password:
                cause = f"the password was refused ({x})"
            else:
                cause = "the server requires a password and the URL has none"
            return BrokerAuthError(f"{where}: {cause}")
    # The most precise cause first: the OS's words (connection refused, name unknown), then
    # a timeout, then redis-py's own message.
    for x in chain:
        if isinstance(x, OSError) and not isinstance(x, TimeoutError) and x.strerror:
            return BrokerUnavailable(f"{where}: {x.strerror.lower()}")
    for x in chain:
        if isinstance(x, (rx.TimeoutError, TimeoutError)):
            return BrokerUnavailable(f"{where}: no answer (timed out)")
    for x in chain:
        if isinstance(x, rx.ConnectionError):
            return BrokerUnavailable(f"{where}: {x}")
    if broker:
        return BrokerUnavailable(f"{where}: {e}")
    return None


@contextmanager
def broker_errors(broker_url: str, backend_url: str) -> Iterator[None]:
    """Re-raise connection failures inside the block as ``BrokerError`` (from the original)."""
    try:
        yield
    except FramefleetError:
        raise
    except Exception as e:
        err = classify(e, broker_url, backend_url)
        if err is None:
            raise
        raise err from e
