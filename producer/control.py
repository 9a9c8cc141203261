"""Job registry and cancel flags shared by client and worker, kept next to the results.

With a Redis result backend both live in Redis (``SET NX`` makes claiming a job_id atomic across
producers). The embedded mode has no Redis: it keeps them as files under the data folder, which
is enough for its one host.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any, Protocol

from celery import Celery

from producer.settings import Settings, get_settings

SPEC_TTL_S = 30 * 86_400
CANCEL_TTL_S = 2 * 86_400


class Flags(Protocol):
    """The job registry and the cancel and preempted flags (Redis or files)."""

    def claim(self, job_id: str, digest: str, clear_cancel: bool = False) -> str | None: ...
    def release(self, job_id: str) -> None: ...
    def registered(self, job_id: str) -> str | None:
        """The digest ``job_id`` was claimed with, or None: never submitted (or expired)."""
        ...
    def set_cancel(self, job_id: str) -> None: ...
    def cancelled(self, job_id: str) -> bool: ...
    def clear_cancel(self, job_id: str) -> None: ...
    def set_preempted(self, node: str) -> None: ...
    def preempted(self, node: str) -> bool: ...


# Claim a job_id (SET NX) and, when the claim is new, clear a stale cancel flag: one round trip.
_CLAIM = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then
  if ARGV[3] == '1' then redis.call('DEL', KEYS[2]) end
  return false
end
return redis.call('GET', KEYS[1])
"""


class RedisFlags:
    def __init__(self, client: Any) -> None:
        self.r = client
        self._claim = client.register_script(_CLAIM)

    def claim(self, job_id: str, digest: str, clear_cancel: bool = False) -> str | None:
        old = self._claim(keys=[f"framefleet:spec:{job_id}", f"framefleet:cancel:{job_id}"],
                          args=[digest, SPEC_TTL_S, "1" if clear_cancel else "0"])
        if old is None:
            return None
        return old.decode() if isinstance(old, bytes) else str(old)

    def release(self, job_id: str) -> None:
        self.r.delete(f"framefleet:spec:{job_id}")

    def registered(self, job_id: str) -> str | None:
        value = self.r.get(f"framefleet:spec:{job_id}")
        if value is None:
            return None
        return value.decode() if isinstance(value, bytes) else str(value)

    def set_cancel(self, job_id: str) -> None:
        self.r.set(f"framefleet:cancel:{job_id}", "1", ex=CANCEL_TTL_S)

    def cancelled(self, job_id: str) -> bool:
        return bool(self.r.exists(f"framefleet:cancel:{job_id}"))

    def clear_cancel(self, job_id: str) -> None:
        self.r.delete(f"framefleet:cancel:{job_id}")

    def set_preempted(self, node: str) -> None:
        self.r.set(f"framefleet:preempted:{node}", "1", ex=CANCEL_TTL_S)

    def preempted(self, node: str) -> bool:
        return bool(self.r.exists(f"framefleet:preempted:{node}"))


class FileFlags:
    def __init__(self, root: Path) -> None:
        self.root = root
        for sub in ("spec", "cancel", "preempted", "tmp"):
            (root / sub).mkdir(parents=True, exist_ok=True)

    def claim(self, job_id: str, digest: str, clear_cancel: bool = False) -> str | None:
        path = self.root / "spec" / job_id
        # Written whole, then linked into place: link() fails if the name exists, and a racing
        # claim never reads a registry file that is created but still empty.
        tmp = self.root / "tmp" / uuid.uuid4().hex
        tmp.write_text(digest)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return path.read_text()
        finally:
            tmp.unlink()
        if clear_cancel:
            self.clear_cancel(job_id)
        return None

    def release(self, job_id: str) -> None:
        (self.root / "spec" / job_id).unlink(missing_ok=True)

    def registered(self, job_id: str) -> str | None:
        try:
            return (self.root / "spec" / job_id).read_text()
        except FileNotFoundError:
            return None

    def set_cancel(self, job_id: str) -> None:
        (self.root / "cancel" / job_id).touch()

    def cancelled(self, job_id: str) -> bool:
        return (self.root / "cancel" / job_id).exists()

    def clear_cancel(self, job_id: str) -> None:
        (self.root / "cancel" / job_id).unlink(missing_ok=True)

    def set_preempted(self, node: str) -> None:
        (self.root / "preempted" / node).touch()

    def preempted(self, node: str) -> bool:
        return (self.root / "preempted" / node).exists()


def flags_for(app: Celery, settings: Settings | None = None) -> Flags:
    """The registry of ``app``'s result backend (Redis), or files under the data folder of
    ``settings`` (default: the environment's) for the embedded mode."""
    client = getattr(app.backend, "client", None)
    if client is not None and hasattr(client, "set"):
        return RedisFlags(client)
    data_dir = (settings or get_settings()).data_dir
    return FileFlags(Path(data_dir).absolute() / "flags")
