"""Open event streams, capped per tenant across every replica (``FRAMEFLEET_API_MAX_STREAMS``,
or the key's ``max_streams``): past the cap, a new stream is a 429 with ``Retry-After``.

Each stream holds a slot in the tenant's sorted set in Redis, scored by when it lapses. The
stream renews it while it runs and gives it back when it ends, however it ends (the job's
end, the client gone); a replica that dies with streams open loses their slots within
``LAPSE_S``, since nobody renews them. An open stream costs a read of the job's state every
``FRAMEFLEET_API_EVENTS_POLL_S``: without a cap, one key could hold thousands.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any

from producer.errors import ApiRequestError
from producer.state import keys

#: A slot nobody renewed for this long no longer counts (its replica is gone).
LAPSE_S = 60
#: How often an open stream renews its slot.
RENEW_S = 15
#: A stream ends when its job does; a refused client cannot know when: look again soon.
RETRY_AFTER_S = 5


@dataclass(frozen=True)
class Slot:
    """One open stream's place in its tenant's count."""

    streams: Streams
    tenant: str
    id: str

    def renew(self) -> None:
        self.streams.renew(self)

    def close(self) -> None:
        self.streams.close(self)


class Streams:
    """The tenants' open streams, in one Redis (shared by every replica)."""

    def __init__(self, r: Any) -> None:
        self.r = r
        self._open = r.register_script(keys.API_STREAM_OPEN)

    def open(self, tenant: str, limit: int) -> Slot:
        """A slot for a new stream of ``tenant``, or a 429 when ``limit`` are open."""
        slot = Slot(self, tenant, secrets.token_hex(8))
        now_ms = int(time.time() * 1000)
        if not self._open(keys=[keys.api_streams(tenant)],
                          args=[slot.id, now_ms, LAPSE_S * 1000, limit]):
            raise ApiRequestError(429, "too_many_streams",
                                  f"{limit} event streams of this key are open",
                                  headers={"Retry-After": str(RETRY_AFTER_S)})
        return slot

    def renew(self, slot: Slot) -> None:
        key = keys.api_streams(slot.tenant)
        lapse_ms = int(time.time() * 1000) + LAPSE_S * 1000
        (self.r.pipeline().zadd(key, {slot.id: lapse_ms}, xx=True)
         .pexpire(key, LAPSE_S * 1000).execute())

    def close(self, slot: Slot) -> None:
        self.r.zrem(keys.api_streams(slot.tenant), slot.id)

    def count(self, tenant: str) -> int:
        """Open streams of ``tenant`` that have not lapsed."""
        return int(self.r.zcount(keys.api_streams(tenant), int(time.time() * 1000), "+inf"))
