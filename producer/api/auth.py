"""API keys and tenants: the key names the tenant, never the request.

The keys file holds no key, only each key's sha256 (``printf %s "$KEY" | sha256sum``) and the
tenant it belongs to. Keys are random tokens (``framefleet api``'s docs make them with 32
random bytes), so a plain hash cannot be reversed by guessing and a slow KDF would only cost
CPU on every request. A presented key is hashed and compared with every entry by
``hmac.compare_digest``, without stopping at a match, so the time taken says nothing about
which entry, if any, is close. The file is read again when it changes (a rotated Secret).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from producer.api.config import load
from producer.errors import ApiRequestError, FramefleetError
from producer.wire.spec import check_id

log = logging.getLogger(__name__)


class KeyEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tenant: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="hex sha256 of the key")
    delete_outputs: bool = Field(
        default=False, description="DELETE of a finished job also deletes its outputs")
    rate_per_minute: int | None = Field(default=None, ge=1, le=1_000_000)
    max_in_flight: int | None = Field(default=None, ge=1, le=100_000)
    max_streams: int | None = Field(default=None, ge=1, le=10_000)

    @field_validator("tenant")
    @classmethod
    def _tenant(cls, v: str) -> str:
        return check_id(v, "tenant")


class KeysFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    keys: list[KeyEntry] = Field(min_length=1)


@dataclass(frozen=True)
class Tenant:
    """Who is asking, as the key says."""

    name: str
    delete_outputs: bool
    rate_per_minute: int
    max_in_flight: int
    max_streams: int


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class KeyRing:
    """The keys file, read at start and again whenever its modification time changes."""

    def __init__(self, path: str, rate_per_minute: int, max_in_flight: int,
                 max_streams: int) -> None:
        self.path = Path(path)
        self.defaults = (rate_per_minute, max_in_flight, max_streams)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._entries: list[tuple[bytes, Tenant]] = []
        self.reload()

    def _read_stamp(self) -> tuple[int, int]:
        st = os.stat(self.path)
        return st.st_mtime_ns, st.st_size

    def reload(self) -> None:
        """Read the file (raises ``SettingsError`` naming the file and the field)."""
        stamp = self._read_stamp()
        parsed = load(self.path, KeysFile, "FRAMEFLEET_API_KEYS_FILE")
        rate, flight, streams = self.defaults
        entries = [(bytes.fromhex(k.sha256), Tenant(k.tenant, k.delete_outputs,
                                                    k.rate_per_minute or rate,
                                                    k.max_in_flight or flight,
                                                    k.max_streams or streams))
                   for k in parsed.keys]
        with self._lock:
            self._entries, self._stamp = entries, stamp

    def _fresh(self) -> list[tuple[bytes, Tenant]]:
        try:
            changed = self._read_stamp() != self._stamp
            if changed:
                self.reload()
        except (OSError, FramefleetError) as e:
            # A half-written or vanished file must not lock every tenant out: keep the last
            # good keys and say so.
            log.error("keys file %s not reloaded: %s", self.path, e)
        with self._lock:
            return self._entries

    def tenant(self, authorization: str | None) -> Tenant:
        """The tenant of an ``Authorization: Bearer KEY`` header, or a 401."""
        scheme, _, key = (authorization or "").partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            raise ApiRequestError(401, "missing_api_key",
                                  "an API key is required: Authorization: Bearer KEY")
        digest = hashlib.sha256(key.encode()).digest()
        found: Tenant | None = None
        for stored, tenant in self._fresh():
            # Every entry is compared: no early exit on a match.
            if hmac.compare_digest(digest, stored) and found is None:
                found = tenant
        if found is None:
            raise ApiRequestError(401, "invalid_api_key", "the API key is not valid")
        return found
