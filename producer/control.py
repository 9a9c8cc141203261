"""Job registry and cancel flags shared by client and worker, kept next to the results.

With a Redis result backend both live in Redis (``SET NX`` makes claiming a job_id atomic across
producers). The embedded mode has no Redis: it keeps them as files under the data folder, which
is enough for its one host.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

from celery import Celery

from producer.settings import get_settings

SPEC_TTL_S = 30 * 86_400
CANCEL_TTL_S = 2 * 86_400


class _Flags(Protocol):
    def claim(self, job_id: str, digest: str) -> str | None: ...
    def release(self, job_id: str) -> None: ...
    def set_cancel(self, job_id: str) -> None: ...
    def cancelled(self, job_id: str) -> bool: ...
    def clear_cancel(self, job_id: str) -> None: ...
    def set_preempted(self, node: str) -> None: ...
    def preempted(self, node: str) -> bool: ...


class RedisFlags:
    def __init__(self, client: Any) -> None:
        self.r = client

    def claim(self, job_id: str, digest: str) -> str | None:
        key = f"framefleet:spec:{job_id}"
        if self.r.set(key, digest, nx=True, ex=SPEC_TTL_S):
            return None
        old = self.r.get(key)
        return old.decode() if isinstance(old, bytes) else old

    def release(self, job_id: str) -> None:
        self.r.delete(f"framefleet:spec:{job_id}")

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
        (root / "spec").mkdir(parents=True, exist_ok=True)
        (root / "cancel").mkdir(parents=True, exist_ok=True)
        (root / "preempted").mkdir(parents=True, exist_ok=True)

    def claim(self, job_id: str, digest: str) -> str | None:
        path = self.root / "spec" / job_id
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return path.read_text()
        with os.fdopen(fd, "w") as f:
            f.write(digest)
        return None

    def release(self, job_id: str) -> None:
        (self.root / "spec" / job_id).unlink(missing_ok=True)

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


def flags_for(app: Celery) -> _Flags:
    """The registry of ``app``'s result backend (Redis), or files for the embedded mode."""
    client = getattr(app.backend, "client", None)
    if client is not None and hasattr(client, "set"):
        return RedisFlags(client)
    return FileFlags(Path(get_settings().data_dir).absolute() / "flags")


def claim_job(app: Celery, job_id: str, digest: str) -> str | None:
    """Register ``job_id`` → spec digest; return the digest already registered, if any."""
    return flags_for(app).claim(job_id, digest)
