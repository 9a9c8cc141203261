"""Whether a job's message is in the broker yet to run: in the queue, or held by a worker.

A job sent around the client (a raw ``send_task``) is claimed in the registry only when a
worker's pool process starts it, which may be long after it was sent: behind other jobs, or
while the only worker's pool process still imports and warms up. Until then Redis holds its
message in one of the queue's priority lists (kombu pushes new messages at the head), or in
kombu's ``unacked`` hash once a worker has taken it. ``message_held`` looks in both, in that
order (a message moves from the list to the hash), so ``JobHandle.wait`` does not call such a
job "no such job".

The look is bounded: the newest ``SCAN_LIMIT`` messages of each priority list, read in pages,
and each candidate parsed only when its raw text holds the key. Redis brokers only; the
embedded mode's filesystem broker says nothing (False).
"""

from __future__ import annotations

import json
from typing import Any

from celery import Celery

from producer.app import QUEUE
from producer.client.connection import CONNECT_TIMEOUT_S, REPLY_TIMEOUT_S
from producer.state import keys
from producer.state.broker import redis_client

#: Newest messages looked at per priority list, and per page.
SCAN_LIMIT = 10_000
PAGE = 500
_REDIS = ("redis://", "rediss://", "sentinel://")


def _names(raw: bytes, key: str, needle: bytes) -> bool:
    """Whether ``raw`` (a kombu envelope, or an ``unacked`` entry: [envelope, exchange,
    routing key]) is the message of task ``key``."""
    if needle not in raw:
        return False
    try:
        value: Any = json.loads(raw)
    except ValueError:
        return False
    envelope = value[0] if isinstance(value, list) and value else value
    headers = envelope.get("headers") if isinstance(envelope, dict) else None
    return isinstance(headers, dict) and headers.get("id") == key


def message_held(client: Any, key: str, queue: str = QUEUE) -> bool:
    """Whether the broker (``client``: its Redis) holds a message of task ``key``."""
    needle = json.dumps(key).encode()
    for name in keys.queue_lists(queue):
        for start in range(0, SCAN_LIMIT, PAGE):
            page = client.lrange(name, start, start + PAGE - 1)
            if any(_names(raw, key, needle) for raw in page):
                return True
            if len(page) < PAGE:
                break
    return any(_names(raw, key, needle) for raw in client.hvals(keys.UNACKED))


def broker_holds(app: Celery, key: str) -> bool:
    """``message_held`` on ``app``'s broker; False for a broker that is not Redis."""
    url = str(app.conf.broker_url or "")
    if not url.startswith(_REDIS):
        return False
    client = redis_client(url, socket_connect_timeout=CONNECT_TIMEOUT_S,
                          socket_timeout=REPLY_TIMEOUT_S)
    try:
        return message_held(client, key)
    finally:
        client.close()
