"""Every Redis key the gateway writes, in one place (the fleet's key-owner module will fold
these in). All live in the result backend's Redis, beside the job registry they extend.
"""

from __future__ import annotations

#: Prefix of everything the gateway owns.
PREFIX = "framefleet:api"
#: How long the gateway remembers a job (the job registry keeps a claim this long).
RECORD_TTL_S = 30 * 86_400


def job(job_id: str) -> str:
    """Hash: the gateway's record of a fleet job_id (field ``record``: JSON with its owner
    tenant, public id, model, size; field ``completed_at``: first time seen finished)."""
    return f"{PREFIX}:job:{job_id}"


def listing(tenant: str) -> str:
    """Sorted set: the tenant's public ids, scored by creation time in ms (newest last)."""
    return f"{PREFIX}:jobs:{tenant}"


def in_flight(tenant: str) -> str:
    """Sorted set: the tenant's fleet job_ids not yet seen finished, scored by submit time."""
    return f"{PREFIX}:inflight:{tenant}"


#: Key prefix of the ``limits`` library's rate-limit windows (it appends its own parts).
RATE_PREFIX = f"{PREFIX}:rate"
