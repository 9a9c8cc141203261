"""The gateway's records of its tenants' jobs, in Redis: owner, listing and jobs in flight.

Job ids are global in the fleet today, so the gateway never submits an id a client chose:
the fleet ``job_id`` is the public id plus a 96-bit digest of (tenant, public id). Two tenants
using the same public id get different fleet jobs, a fleet id names its tenant's job only,
and the record (written ``HSETNX``) names the owner as well. An id that is not a plain name
(a path, ``..``, too long) is refused before any lookup.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any, Literal

from producer.errors import ApiRequestError
from producer.state import keys

#: Public ids: what a client may name (the digest suffix keeps the fleet id within 128).
PUBLIC_ID_RE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}$")
DIGEST_HEX = 24

# Reserve a slot in the tenant's in-flight set, unless it is full (atomic across replicas).
def valid_public_id(value: str) -> bool:
    return bool(PUBLIC_ID_RE.fullmatch(value)) and ".." not in value


def fleet_id(tenant: str, public_id: str) -> str:
    """The fleet ``job_id`` of a tenant's public id (deterministic: resubmits find it)."""
    digest = hashlib.sha256(f"{tenant}\0{public_id}".encode()).hexdigest()[:DIGEST_HEX]
    return f"{public_id}.{digest}"


def new_video_id() -> str:
    return f"video_{secrets.token_hex(16)}"


@dataclass(frozen=True)
class Record:
    """What the gateway knows of a job beyond the fleet's own state."""

    id: str
    job_id: str
    tenant: str
    api: Literal["videos", "jobs"]
    created_at: float
    output: str  # the job's output folder: {output.uri}/{tenant}/{job_id}
    model: str | None = None
    size: str | None = None
    seconds: str | None = None
    prompt: str | None = None
    tier: str | None = None
    input_uri: str | None = None
    generate: bool = True  # denoise then decode (progress weighs both), or latents only

    def dumps(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def loads(cls, text: str | bytes) -> Record:
        return cls(**json.loads(text))


class Registry:
    """Records, listings and in-flight sets of one Redis (``decode_responses=False``)."""

    def __init__(self, r: Any) -> None:
        self.r = r
        self._reserve = r.register_script(keys.API_RESERVE)
        self._progress = r.register_script(keys.API_PROGRESS)

    def create(self, rec: Record) -> tuple[Record, bool]:
        """Write ``rec`` unless its fleet id has a record: then return that one (the same
        tenant's job: the id's digest names the tenant). The flag: whether this call wrote it."""
        key = keys.api_job(rec.job_id)
        pipe = self.r.pipeline()
        pipe.hsetnx(key, "record", rec.dumps()).expire(key, keys.API_RECORD_TTL_S)
        created, _ = pipe.execute()
        if not created:
            existing = self.get(rec.tenant, rec.id)
            if existing is None:
                raise ApiRequestError(409, "conflict", "the job id is taken")
            return existing, False
        listing = keys.api_listing(rec.tenant)
        now_ms = time.time() * 1000
        (self.r.pipeline().zadd(listing, {rec.id: int(rec.created_at * 1000)})
         .zremrangebyscore(listing, "-inf", now_ms - keys.API_RECORD_TTL_S * 1000)
         .expire(listing, keys.API_RECORD_TTL_S).execute())
        return rec, True

    def get(self, tenant: str, public_id: str) -> Record | None:
        """The tenant's job ``public_id``, or None: unknown, another tenant's, or not an id."""
        if not valid_public_id(public_id):
            return None
        raw = self.r.hget(keys.api_job(fleet_id(tenant, public_id)), "record")
        if raw is None:
            return None
        rec = Record.loads(raw)
        return rec if rec.tenant == tenant and rec.id == public_id else None

    def forget(self, rec: Record) -> None:
        (self.r.pipeline().delete(keys.api_job(rec.job_id))
         .zrem(keys.api_listing(rec.tenant), rec.id)
         .zrem(keys.api_in_flight(rec.tenant), rec.job_id).execute())

    def progress(self, rec: Record, percent: int) -> int:
        """The progress to show: ``percent``, or more if a replica showed more before (a
        cancel or a retry reads 0 from the fleet; what was shown never goes back)."""
        return int(self._progress(keys=[keys.api_job(rec.job_id)], args=[percent]))

    def restart(self, rec: Record) -> None:
        """A failed or cancelled job sent again: its new run counts from 0, and finishes anew."""
        self.r.hdel(keys.api_job(rec.job_id), "percent", "completed_at")

    def completed_at(self, rec: Record) -> float:
        """When a replica first saw the job finished (the same answer on every replica)."""
        key = keys.api_job(rec.job_id)
        self.r.hsetnx(key, "completed_at", repr(time.time()))
        return float(self.r.hget(key, "completed_at"))

    def page(self, tenant: str, after: str | None, limit: int,
             order: Literal["asc", "desc"]) -> tuple[list[Record], bool]:
        """Up to ``limit`` records after the id ``after``, newest first for ``desc``."""
        listing = keys.api_listing(tenant)
        start = 0
        if after is not None:
            rank = (self.r.zrevrank if order == "desc" else self.r.zrank)(listing, after) \
                if valid_public_id(after) else None
            if rank is None:
                raise ApiRequestError(400, "invalid_value", "after: no such id", "after")
            start = rank + 1
        fetch = self.r.zrevrange if order == "desc" else self.r.zrange
        ids = [i.decode() if isinstance(i, bytes) else i
               for i in fetch(listing, start, start + limit)]
        pipe = self.r.pipeline()
        for public in ids[:limit]:
            pipe.hget(keys.api_job(fleet_id(tenant, public)), "record")
        records, gone = [], []
        for public, raw in zip(ids[:limit], pipe.execute(), strict=True):
            if raw is None:
                gone.append(public)  # its record expired: drop it from the listing
            else:
                records.append(Record.loads(raw))
        if gone:
            self.r.zrem(listing, *gone)
        return records, len(ids) > limit

    def reserve(self, tenant: str, job_id: str, limit: int,
                finished: Callable[[Iterable[str]], list[str]]) -> bool:
        """Count ``job_id`` as in flight unless the tenant has ``limit`` unfinished jobs.

        ``finished`` names, of the ids counted now, those that ended: they are dropped first.
        """
        key = keys.api_in_flight(tenant)
        members = [m.decode() if isinstance(m, bytes) else m for m in self.r.zrange(key, 0, -1)]
        done = finished(m for m in members if m != job_id)
        if done:
            self.r.zrem(key, *done)
        return bool(self._reserve(keys=[key], args=[job_id, int(time.time() * 1000), limit,
                                                    keys.API_RECORD_TTL_S]))

    def release(self, tenant: str, job_id: str) -> None:
        self.r.zrem(keys.api_in_flight(tenant), job_id)
