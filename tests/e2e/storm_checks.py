"""The storm's end-of-storm checks: every job final and ended once, its output whole, nothing
written after its end (a zombie's write would be) or outside the jobs' folders, one ledger
record per job, no count over the ends, no playlist left open. ``check_outcome`` returns the
figures, ``problems`` listing what failed."""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from producer.app import TASK_NAME
from producer.wire.results import LedgerRecord
from tests.e2e.storm import END, SHAPES, ledger_problems
from tests.e2e.storm_faults import Faults
from tests.e2e.storm_fleet import TENANT, StormFleet
from tests.e2e.storm_metrics import Scraper

#: A write this long after the job's end is a write after it (S3 keeps whole seconds).
AFTER_END_S = 1.5
_STAMP = r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): \w+/[\w-]+\] "
_TASK = re.escape(TASK_NAME)


@dataclass
class Logs:
    """What the hosts' logs say, per job key, read once."""

    received: dict[str, list[float]] = field(default_factory=dict)  # unix times, sorted
    succeeded: Counter[str] = field(default_factory=Counter)
    lost: Counter[str] = field(default_factory=Counter)  # runs that learnt they lost the lease
    stopped: Counter[str] = field(default_factory=Counter)  # ... and stopped without an end

    @classmethod
    def read(cls, texts: list[str]) -> Logs:
        logs = cls()
        received = re.compile(_STAMP + rf"Task {_TASK}\[([^\]]+)\] received", re.M)
        # Celery's line for a run whose task returned (not "succeeded before the worker was
        # lost": the main process's word on a SUCCESS another run stored).
        succeeded = re.compile(rf"Task {_TASK}\[([^\]]+)\] succeeded in ")
        # The renewal's own line (the stop's line quotes it again).
        lost = re.compile(r"\] job (\S+): this run \(generation [^)]*\) lost its lease")
        stopped = re.compile(r"job (\S+): this run stopped without an end")
        for text in texts:
            for stamp, key in received.findall(text):
                t = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
                logs.received.setdefault(key, []).append(t)
            logs.succeeded.update(succeeded.findall(text))
            logs.lost.update(lost.findall(text))
            logs.stopped.update(stopped.findall(text))
        for times in logs.received.values():
            times.sort()
        return logs

    def next_receipt(self, key: str, after: float) -> float | None:
        later = [t for t in self.received.get(key, []) if t > after]
        return later[0] if later else None


def _ended_at(meta: dict[str, Any]) -> datetime | None:
    raw = meta.get("date_done")
    if not raw:
        return None
    done = raw if isinstance(raw, datetime) else datetime.fromisoformat(str(raw))
    return done if done.tzinfo else done.replace(tzinfo=UTC)


def check_outcome(fleet: StormFleet, faults: Faults, metas: dict[str, dict[str, Any]],
                  reference: dict[int, list[str]], scraper: Scraper) -> dict[str, Any]:
    """Every check of the end state (call it on the services' thread)."""
    problems: list[str] = list(faults.errors)
    s3, bucket = fleet.s3.client(), fleet.bucket
    shape_of = {fleet.keys_of[j.job_id]: j.shape for j in fleet.plan.jobs}
    listed = {o["Key"]: o["LastModified"] for page in s3.get_paginator("list_objects_v2")
              .paginate(Bucket=bucket) for o in page.get("Contents", [])}
    statuses = {k: str(m.get("status")) for k, m in metas.items()}
    folders: dict[str, str] = {}  # out/<tenant>/<job_id>/ → key
    for key in metas:
        tenant, _, job_id = key.rpartition(":")
        folders[f"out/{tenant or 'default'}/{job_id}/"] = key
    problems += _outputs(fleet, metas, statuses, shape_of, reference)
    # Nothing outside the output prefix (and the ledger, and the inputs).
    inputs = {f"in/{TENANT}/shape-{i}.npy" for i in range(len(SHAPES))}
    for obj in listed:
        folder = "/".join(obj.split("/")[:3]) + "/"
        if obj not in inputs and not obj.startswith("ledger/") and (
                not obj.startswith("out/") or folder not in folders):
            problems.append(f"written outside the jobs' output folders: {obj}")
    open_playlists = _open_playlists(fleet, listed, statuses, folders)
    problems += [f"playlist left open: {p}" for p in open_playlists]
    # One ledger record per job, with its end; nothing of a job written after its end.
    ledger = {o: LedgerRecord.model_validate_json(s3.get_object(Bucket=bucket, Key=o)["Body"]
                                                  .read()) for o in listed
              if o.startswith("ledger/")}
    problems += ledger_problems(list(ledger.values()), statuses)
    late = _written_after_end(metas, listed, folders, {o: r.key for o, r in ledger.items()})
    problems += late
    # The workers' counts never more than the ends; no job succeeded twice (the logs).
    counted = scraper.totals()
    ends = {v: sum(1 for s in statuses.values() if END.get(s) == v) for v in END.values()}
    problems += [f"framefleet_jobs_total{{status={outcome}}} {counted[outcome]} > {n}"
                 for outcome, n in ends.items() if counted.get(outcome, 0.0) > n]
    logs = Logs.read([h.log_text() for h in fleet.hosts])
    twice = {k: n for k, n in logs.succeeded.items() if n > 1}
    problems += [f"{k}: succeeded {n} times (workers' logs)"
                 + (f"; {logs.lost[k]} run(s) of it had lost the lease" if logs.lost[k] else "")
                 for k, n in twice.items()]
    problems += [f"{k} failed: {str(metas[k].get('result') or {})[:200]}"
                 for k, s in statuses.items() if s == "FAILURE"][:5]
    return {"problems": problems, "ends": ends, "counted": counted, "records": len(ledger),
            "objects": len(listed), "open_playlists": len(open_playlists),
            "succeeded_twice": len(twice), "written_late": len(late),
            "delays": _delays(faults.kills, logs), "detected": _delays(faults.cuts, logs),
            "zombies": sum(logs.lost.values()), "zombie_jobs": len(logs.lost),
            "stopped": sum(logs.stopped.values()),
            "resent": sum(h.log_text().count(" sent again by ") for h in fleet.hosts),
            "requeued": sum(h.log_text().count(" requeued by ") for h in fleet.hosts)}


def _outputs(fleet: StormFleet, metas: dict[str, dict[str, Any]], statuses: dict[str, str],
             shape_of: dict[str, int], reference: dict[int, list[str]]) -> list[str]:
    """One output per success, its segments identical to the fault-free run of its shape."""
    s3, bucket, problems = fleet.s3.client(), fleet.bucket, []
    for key, meta in metas.items():
        if statuses[key] != "SUCCESS":
            continue
        manifest = (meta.get("result") or {}).get("manifest") or {}
        hashes = [seg["sha256"] for seg in manifest.get("segments", [])]
        if hashes != reference[shape_of[key]]:
            problems.append(f"{key}: segments {hashes} != fault-free {reference[shape_of[key]]}")
            continue
        for seg, want in zip(manifest["segments"], hashes, strict=True):
            obj = seg["uri"].split(f"s3://{bucket}/", 1)[1]
            body = s3.get_object(Bucket=bucket, Key=obj)["Body"].read()
            if hashlib.sha256(body).hexdigest() != want:
                problems.append(f"{key}: stored {obj} differs from its manifest")
    return problems


def _open_playlists(fleet: StormFleet, listed: dict[str, datetime], statuses: dict[str, str],
                    folders: dict[str, str]) -> list[str]:
    s3, out = fleet.s3.client(), []
    for obj in listed:
        if obj.endswith("/index.m3u8"):
            text = s3.get_object(Bucket=fleet.bucket, Key=obj)["Body"].read().decode()
            if "#EXT-X-ENDLIST" not in text:
                out.append(f"{obj} ({statuses.get(folders.get(obj.rsplit('/', 1)[0] + '/', ''))})")
    return out


def _written_after_end(metas: dict[str, dict[str, Any]], listed: dict[str, datetime],
                       folders: dict[str, str], ledger_keys: dict[str, str]) -> list[str]:
    """Objects of a job that succeeded or failed, written after its end was stored (its run
    writes everything before; a zombie's late write would land after)."""
    owner = {o: folders.get("/".join(o.split("/")[:3]) + "/") for o in listed
             if o.startswith("out/")} | ledger_keys
    out = []
    for obj, key in owner.items():
        meta = metas.get(key or "") or {}
        done = _ended_at(meta) if meta.get("status") in ("SUCCESS", "FAILURE") else None
        if done is not None and listed[obj] > done + timedelta(seconds=AFTER_END_S):
            out.append(f"{obj} written {(listed[obj] - done).total_seconds():.1f} s after "
                       f"{key} ended {meta['status']}")
    return out


def _delays(events: list[tuple[float, list[str]]], logs: Logs) -> list[float]:
    """From each fault to the next receipt of each job running where it hit."""
    return [after - t for t, running in events for key in running
            if (after := logs.next_receipt(key, t)) is not None]
