"""Job registry and cancel flags shared by client and worker, kept next to the results.

With a Redis result backend both live in Redis (``SET NX`` makes claiming a job_id atomic across
producers). The embedded mode has no Redis: it keeps them as files under the data folder, which
is enough for its one host.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any, Protocol

from celery import Celery

from producer.settings import Settings, get_settings
from producer.state import keys
from producer.state.keys import FLAG_TTL_S, SPEC_TTL_S


class Flags(Protocol):
    """The job registry and the cancel and preempted flags (Redis or files)."""

    def claim(self, job_id: str, digest: str, clear_cancel: bool = False,
              spec_json: str = "") -> str | None: ...
    def first_spec(self, job_id: str) -> str | None:
        """The JSON of the spec ``job_id`` was claimed with, when the claim kept it."""
        ...
    def last_taken(self) -> float | None:
        """Unix time a worker last received a job, or None (never, or since Redis lost it)."""
        ...
    def release(self, job_id: str) -> None: ...
    def registered(self, job_id: str) -> str | None:
        """The digest ``job_id`` was claimed with, or None: never submitted (or expired)."""
        ...
    def set_cancel(self, job_id: str) -> None: ...
    def cancelled(self, job_id: str) -> bool: ...
    def clear_cancel(self, job_id: str) -> None: ...
    def set_preempted(self, node: str) -> None: ...
    def preempted(self, node: str) -> bool: ...
    def start_run(self, job_id: str, holder: str) -> tuple[int, str | None]: ...
    def end_run(self, job_id: str, holder: str, final: bool) -> None: ...
    def end_killed_run(self, job_id: str, node: str, pid: int) -> bool:
        """The run of ``job_id`` in process ``pid`` of ``node`` was killed (Celery's hard time
        limit) and the job ended: forget the run; True if it had not reached its end itself."""
        ...
    def mark_stuck(self, job_id: str, node: str, pid: int, stage: str, idle_s: float) -> bool:
        """The run of ``job_id`` in process ``pid`` of ``node`` stopped making progress in
        ``stage`` (``worker.watchdog``): keep it for the poison cap of the job's next run;
        True if the record still named that run."""
        ...
    def stuck(self, job_id: str) -> tuple[str, float] | None:
        """The stage and idle seconds of the job's last run taken for hung, or None."""
        ...
    def hand_over_end(self, end: str, ttl_s: int) -> None:
        """Keep ``end`` (a job end decided outside a pool process, as JSON) for one to take."""
        ...
    def take_ends(self, limit: int = 100) -> list[str]:
        """Take (remove) up to ``limit`` ends handed over, oldest first."""
        ...
    def mark_started(self, job_id: str, taken: bool = True) -> None:
        """A worker received ``job_id`` (``taken``: and so took a job now, ``last_taken``)."""
        ...
    def mark_sent(self, job_id: str) -> None:
        """The client sent ``job_id`` to the queue now."""
        ...
    def sent_at(self, job_id: str) -> float | None:
        """Unix time the client last sent ``job_id``, or None (not recorded)."""
        ...
    def take_started(self, job_id: str) -> bool: ...
    def reset_runs(self, job_id: str) -> None: ...


class RedisFlags:
    def __init__(self, client: Any) -> None:
        self.r = client
        self._claim = client.register_script(keys.CLAIM)

    def claim(self, job_id: str, digest: str, clear_cancel: bool = False,
              spec_json: str = "") -> str | None:
        old = self._claim(keys=[keys.claim(job_id), keys.cancel(job_id), keys.spec_doc(job_id)],
                          args=[digest, SPEC_TTL_S, "1" if clear_cancel else "0", spec_json])
        if old is None:
            return None
        return old.decode() if isinstance(old, bytes) else str(old)

    def claim_many(self, claims: list[tuple[str, str, str]]) -> list[str | None]:
        """``claim(job_id, digest, clear_cancel=True, spec_json)`` for each (job_id, digest,
        spec_json), in one round trip (a bulk submit); each answer as ``claim``'s."""
        pipe = self.r.pipeline(transaction=False)
        for job_id, digest, spec_json in claims:
            self._claim(keys=[keys.claim(job_id), keys.cancel(job_id), keys.spec_doc(job_id)],
                        args=[digest, SPEC_TTL_S, "1", spec_json], client=pipe)
        return [None if old is None else _text(old) for old in pipe.execute()]

    def release_many(self, job_ids: list[str]) -> None:
        """``release`` of each of ``job_ids``, in one round trip."""
        if job_ids:
            self.r.delete(*(k for j in job_ids for k in (keys.claim(j), keys.spec_doc(j))))

    def mark_sent_many(self, job_ids: list[str]) -> None:
        """``mark_sent`` of each of ``job_ids``, in one round trip."""
        if not job_ids:
            return
        now = time.time()
        pipe = self.r.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hset(keys.runs(job_id), "sent_at", repr(now)).expire(keys.runs(job_id),
                                                                      SPEC_TTL_S)
        pipe.zadd(keys.QUEUED, dict.fromkeys(job_ids, now)).execute()

    def first_spec(self, job_id: str) -> str | None:
        value = self.r.get(keys.spec_doc(job_id))
        return None if value is None else _text(value)

    def last_taken(self) -> float | None:
        value = self.r.get(keys.LAST_TAKEN)
        return None if value is None else float(_text(value))

    def release(self, job_id: str) -> None:
        self.r.delete(keys.claim(job_id), keys.spec_doc(job_id))

    def registered(self, job_id: str) -> str | None:
        value = self.r.get(keys.claim(job_id))
        if value is None:
            return None
        return value.decode() if isinstance(value, bytes) else str(value)

    def set_cancel(self, job_id: str) -> None:
        self.r.set(keys.cancel(job_id), "1", ex=FLAG_TTL_S)

    def cancelled(self, job_id: str) -> bool:
        return bool(self.r.exists(keys.cancel(job_id)))

    def clear_cancel(self, job_id: str) -> None:
        self.r.delete(keys.cancel(job_id))

    def set_preempted(self, node: str) -> None:
        self.r.set(keys.preempted(node), "1", ex=FLAG_TTL_S)

    def preempted(self, node: str) -> bool:
        return bool(self.r.exists(keys.preempted(node)))

    def start_run(self, job_id: str, holder: str) -> tuple[int, str | None]:
        """Record that ``holder`` runs ``job_id`` now; returns the worker losses so far and
        the holder of the last lost run. A run recorded earlier and never ended is counted as
        lost here: the lease guarantees that no other run of the job is alive."""
        losses, lost_on = self.r.eval(keys.START_RUN, 1, keys.runs(job_id), holder,
                                      SPEC_TTL_S)
        return int(losses), _text(lost_on) if lost_on else None

    def end_run(self, job_id: str, holder: str, final: bool) -> None:
        """``holder``'s run ended (not lost); ``final``: the job ended, its losses are reset."""
        self.r.eval(keys.END_RUN, 1, keys.runs(job_id), holder, "1" if final else "0")

    def end_killed_run(self, job_id: str, node: str, pid: int) -> bool:
        return bool(self.r.eval(keys.END_KILLED_RUN, 1, keys.runs(job_id), f"{node} {pid} "))

    def mark_stuck(self, job_id: str, node: str, pid: int, stage: str, idle_s: float) -> bool:
        return bool(self.r.eval(keys.MARK_STUCK, 1, keys.runs(job_id), f"{node} {pid} ",
                                f"{stage} {idle_s:.0f}"))

    def stuck(self, job_id: str) -> tuple[str, float] | None:
        return _stuck(self.r.hget(keys.runs(job_id), "stuck"))

    def hand_over_end(self, end: str, ttl_s: int) -> None:
        self.r.pipeline().rpush(keys.ENDS, end).expire(keys.ENDS, ttl_s).execute()

    def take_ends(self, limit: int = 100) -> list[str]:
        # LRANGE + LTRIM in one transaction: any Redis version, and each end to one taker.
        items, _ = self.r.pipeline().lrange(keys.ENDS, 0, limit - 1).ltrim(
            keys.ENDS, limit, -1).execute()
        return [_text(v) for v in items]

    def mark_started(self, job_id: str, taken: bool = True) -> None:
        """A worker received ``job_id``: from now on a PENDING state means its result expired."""
        key = keys.runs(job_id)
        pipe = self.r.pipeline().hset(key, "started", "1").expire(key, SPEC_TTL_S)
        pipe.zrem(keys.QUEUED, job_id)  # received: no longer the reconciler's to watch
        if taken:
            pipe.set(keys.LAST_TAKEN, repr(time.time()))
        pipe.execute()

    def mark_sent(self, job_id: str) -> None:
        """The client sent ``job_id`` now: the status hints read the time, and the job is
        watched by the lost-message reconciler until a worker receives it."""
        key, now = keys.runs(job_id), time.time()
        self.r.pipeline().hset(key, "sent_at", repr(now)).expire(key, SPEC_TTL_S).zadd(
            keys.QUEUED, {job_id: now}).execute()

    def sent_at(self, job_id: str) -> float | None:
        value = self.r.hget(keys.runs(job_id), "sent_at")
        return None if value is None else float(_text(value))

    def take_started(self, job_id: str) -> bool:
        """Clear the job's "has run" mark; True for the one caller that found it (who sends
        the job again: its end is a new one, so the marks of the last end's ledger record
        and count go too)."""
        taken = bool(self.r.hdel(keys.runs(job_id), "started"))
        if taken:
            self.r.hdel(keys.runs(job_id), *keys.END_FIELDS,
                        *(f"{field}:{what}" for field in keys.END_FIELDS
                          for what in ("by", "uri")))
        return taken

    def reset_runs(self, job_id: str) -> None:
        """Forget the job's run record (a resubmit after FAILURE starts with no losses, even
        if its last run was killed by the hard time limit and never ended)."""
        self.r.delete(keys.runs(job_id))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _stuck(value: Any) -> tuple[str, float] | None:
    """``stage idle_s`` as kept by ``mark_stuck``; None for none (or one unreadable)."""
    if value is None:
        return None
    stage, _, idle = _text(value).partition(" ")
    try:
        return stage, float(idle)
    except ValueError:
        return stage, 0.0


class FileFlags:
    def __init__(self, root: Path) -> None:
        self.root = root
        for sub in ("spec", "specdoc", "cancel", "preempted", "runs", "ends", "tmp"):
            (root / sub).mkdir(parents=True, exist_ok=True)

    def claim(self, job_id: str, digest: str, clear_cancel: bool = False,
              spec_json: str = "") -> str | None:
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
        if spec_json:
            (self.root / "specdoc" / job_id).write_text(spec_json)
        return None

    def first_spec(self, job_id: str) -> str | None:
        try:
            return (self.root / "specdoc" / job_id).read_text()
        except FileNotFoundError:
            return None

    def last_taken(self) -> float | None:
        try:
            return (self.root / "last_taken").stat().st_mtime
        except FileNotFoundError:
            return None

    def release(self, job_id: str) -> None:
        (self.root / "spec" / job_id).unlink(missing_ok=True)
        (self.root / "specdoc" / job_id).unlink(missing_ok=True)

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

    # The run record as a JSON file, rewritten whole: the embedded mode has one worker.
    def _runs(self, job_id: str) -> tuple[Path, dict[str, Any]]:
        path = self.root / "runs" / f"{job_id}.json"
        try:
            return path, dict(json.loads(path.read_text()))
        except (FileNotFoundError, ValueError):
            return path, {}

    def _write_runs(self, path: Path, record: dict[str, Any]) -> None:
        tmp = self.root / "tmp" / uuid.uuid4().hex
        tmp.write_text(json.dumps(record))
        os.replace(tmp, path)

    def start_run(self, job_id: str, holder: str) -> tuple[int, str | None]:
        path, record = self._runs(job_id)
        if record.get("running"):
            record["losses"] = int(record.get("losses", 0)) + 1
            record["lost_on"] = record["running"]
        record["running"] = holder
        self._write_runs(path, record)
        return int(record.get("losses", 0)), record.get("lost_on")

    def end_run(self, job_id: str, holder: str, final: bool) -> None:
        path, record = self._runs(job_id)
        if record.get("running") != holder:
            return
        del record["running"]
        if final:
            for field in ("losses", "lost_on", "stuck"):
                record.pop(field, None)
        self._write_runs(path, record)

    def end_killed_run(self, job_id: str, node: str, pid: int) -> bool:
        path, record = self._runs(job_id)
        if not str(record.get("running", "")).startswith(f"{node} {pid} "):
            return False
        for field in ("running", "losses", "lost_on", "stuck"):
            record.pop(field, None)
        self._write_runs(path, record)
        return True

    def mark_stuck(self, job_id: str, node: str, pid: int, stage: str, idle_s: float) -> bool:
        path, record = self._runs(job_id)
        if not str(record.get("running", "")).startswith(f"{node} {pid} "):
            return False
        self._write_runs(path, {**record, "stuck": f"{stage} {idle_s:.0f}"})
        return True

    def stuck(self, job_id: str) -> tuple[str, float] | None:
        return _stuck(self._runs(job_id)[1].get("stuck"))

    def hand_over_end(self, end: str, ttl_s: int) -> None:
        tmp = self.root / "tmp" / uuid.uuid4().hex
        tmp.write_text(end)
        os.replace(tmp, self.root / "ends" / f"{time.time_ns()}-{uuid.uuid4().hex[:8]}")

    def take_ends(self, limit: int = 100) -> list[str]:
        taken: list[str] = []
        for path in sorted((self.root / "ends").iterdir()):
            if len(taken) >= limit:
                break
            mine = self.root / "tmp" / uuid.uuid4().hex
            try:
                path.rename(mine)  # one process wins the rename: each end to one taker
            except FileNotFoundError:
                continue
            taken.append(mine.read_text())
            mine.unlink()
        return taken

    def mark_started(self, job_id: str, taken: bool = True) -> None:
        if taken:
            (self.root / "last_taken").touch()
        path, record = self._runs(job_id)
        if not record.get("started"):
            self._write_runs(path, {**record, "started": True})

    def mark_sent(self, job_id: str) -> None:
        path, record = self._runs(job_id)
        self._write_runs(path, {**record, "sent_at": time.time()})

    def sent_at(self, job_id: str) -> float | None:
        value = self._runs(job_id)[1].get("sent_at")
        return None if value is None else float(value)

    def take_started(self, job_id: str) -> bool:
        path, record = self._runs(job_id)
        if not record.pop("started", False):
            return False
        self._write_runs(path, record)
        return True

    def reset_runs(self, job_id: str) -> None:
        (self.root / "runs" / f"{job_id}.json").unlink(missing_ok=True)


def flags_for(app: Celery, settings: Settings | None = None) -> Flags:
    """The registry of ``app``'s result backend (Redis), or files under the data folder of
    ``settings`` (default: the environment's) for the embedded mode."""
    client = getattr(app.backend, "client", None)
    if client is not None and hasattr(client, "set"):
        return RedisFlags(client)
    data_dir = (settings or get_settings()).data_dir
    return FileFlags(Path(data_dir).absolute() / "flags")
