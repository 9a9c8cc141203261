"""The gateway's parts, built once per process from the settings, and the request's tenant.

``Gateway`` holds the producer client (the only way to the fleet), the registry of records,
the store, the keys and the models. ``tenant`` is the dependency every keyed route takes: the
key names the tenant, then the tenant's rate limit is spent (Redis, shared by every replica).
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections.abc import Iterable
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from limits import RateLimitItemPerMinute
from limits.storage import RedisStorage
from limits.strategies import MovingWindowRateLimiter
from redis.exceptions import RedisError

from producer.api.auth import KeyRing, Tenant
from producer.api.catalog import load_catalog
from producer.api.errors import fleet_unavailable, not_found
from producer.api.reach import folder_random
from producer.api.registry import Record, Registry
from producer.api.store import Store
from producer.api.streams import Streams
from producer.api.video import View, progress
from producer.client import Client
from producer.client.jobstate import FINISHED
from producer.errors import ApiRequestError, SettingsError
from producer.settings import Settings
from producer.state import keys
from producer.state.broker import redis_client
from producer.wire.spec import JobResult


class Gateway:
    """Everything a request needs; one per process, shared by its threads."""

    def __init__(self, settings: Settings, client: Client | None = None) -> None:
        if not settings.api_keys_file:
            raise SettingsError("FRAMEFLEET_API_KEYS_FILE: the API needs a keys file")
        if not settings.api_models_file:
            raise SettingsError("FRAMEFLEET_API_MODELS_FILE: the API needs a model map")
        if not (settings.output_prefix or "").startswith("s3://"):
            raise SettingsError("FRAMEFLEET_OUTPUT_PREFIX: the API writes jobs under an "
                                "s3:// output prefix; set one")
        self.settings = settings
        self.keyring = KeyRing(settings.api_keys_file, settings.api_rate_per_minute,
                               settings.api_max_in_flight, settings.api_max_streams)
        self.catalog = load_catalog(settings.api_models_file)
        self.client = client or Client(settings=settings)
        self.redis = redis_client(settings.backend_url, settings, socket_timeout=5,
                                  socket_connect_timeout=5, health_check_interval=30)
        self.registry = Registry(self.redis)
        self.streams = Streams(self.redis)
        self.store = Store(settings)
        # A moving window: exact (each hit is kept for a minute), and it says when the oldest
        # hit leaves it, which is the honest Retry-After.
        self.limiter = MovingWindowRateLimiter(RedisStorage(
            settings.backend_url, connection_pool=self.redis.connection_pool,
            key_prefix=keys.API_RATE_PREFIX))

    @property
    def output_prefix(self) -> str:
        assert self.settings.output_prefix is not None
        return self.settings.output_prefix.rstrip("/")

    def _spend(self, per_minute: int, who: str, what: str) -> None:
        """One request of ``who``'s ``per_minute``, or a 429 saying when one is free again."""
        item = RateLimitItemPerMinute(per_minute)
        try:
            allowed = self.limiter.hit(item, who)
            reset = 0.0 if allowed else self.limiter.get_window_stats(item, who).reset_time
        except RedisError:
            # The limits live in Redis: without it nothing can be counted, nor served.
            raise fleet_unavailable() from None
        if not allowed:
            wait = max(1, math.ceil(reset - time.time()))
            raise ApiRequestError(429, "rate_limit_exceeded",
                                  f"over {per_minute} requests per minute {what}",
                                  headers={"Retry-After": str(wait)})

    def authorize(self, authorization: str | None) -> Tenant:
        """The key's tenant, once its rate limit allows this request (else a 429)."""
        tenant = self.keyring.tenant(authorization)
        self._spend(tenant.rate_per_minute, tenant.name, "for this key")
        return tenant

    def keyed(self, authorization: str | None) -> bool:
        """Whether the request carries a valid key (its tenant's own limit applies)."""
        try:
            self.keyring.tenant(authorization)
        except ApiRequestError:
            return False
        return True

    def admit_unkeyed(self, host: str | None) -> None:
        """Spend one request of a client address without a valid key, or a 429. The limiter's
        identities never meet a tenant's: a tenant name has no ':'."""
        self._spend(self.settings.api_anon_rate_per_minute, f"addr:{client_network(host)}",
                    "without a valid key from this address")

    def lookup(self, tenant: Tenant, public_id: str, what: str = "video") -> Record:
        """The tenant's record, or the same 404 for unknown, foreign and malformed ids."""
        rec = self.registry.get(tenant.name, public_id)
        if rec is None:
            raise not_found(what)
        return rec

    def view(self, rec: Record) -> View:
        """Read the fleet's state (and the result of a job that succeeded)."""
        js = self.client.state(rec.job_id, rec.tenant)
        result = None
        if js.state == "SUCCESS":
            result = self.client.get(rec.job_id, rec.tenant).result()
        completed = None
        if js.finished:
            completed = self.registry.completed_at(rec)
            self.registry.release(rec.tenant, rec.job_id)
        percent = progress(rec, js)
        if percent < 100:
            percent = self.registry.progress(rec, percent)
        return View(rec, js, result, completed, percent, self._noise(rec, result))

    def _noise(self, rec: Record, result: JobResult | None) -> bool | None:
        """Random weights: the result says; before it, the model's folder where this host has
        it (a running job's row says "noise" too); None where neither can tell."""
        if result is not None:
            return result.random_weights
        entry = self.catalog.models.get(rec.model or "") if rec.generate else None
        return folder_random(entry.folder) if entry is not None else None

    def finished(self, tenant: str, job_ids: Iterable[str]) -> list[str]:
        """Of ``tenant``'s ``job_ids``, those that ended (or that the fleet forgot)."""
        return [j for j in job_ids
                if self.client.state(j, tenant).state in FINISHED | {"UNKNOWN"}]


def client_network(host: str | None) -> str:
    """What the per-address limit counts: an IPv4 address, an IPv6 client's /64 (one host
    may hold all of a /64), or the peer as given when it is not an address."""
    try:
        address = ipaddress.ip_address(host or "")
    except ValueError:
        return (host or "unknown")[:64]
    if address.version == 6:
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


def _gateway(request: Request) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw


GatewayDep = Annotated[Gateway, Depends(_gateway)]
# Declared for the OpenAPI schema ("bearer" security on every keyed route); checked below.
_bearer = HTTPBearer(auto_error=False, description="an API key: Authorization: Bearer KEY")


def _tenant(gw: GatewayDep, request: Request,
            _: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> Tenant:
    return gw.authorize(request.headers.get("authorization"))


TenantDep = Annotated[Tenant, Depends(_tenant)]
