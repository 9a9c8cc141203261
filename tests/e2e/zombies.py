"""A zombie run, staged: a host in the middle of a job loses its path to the fleet (stopped, or
cut off by a partition) longer than the job's lease; the job runs again on another host; the
first host comes back (the heal) 2 s after the other run started, or after the job's SUCCESS.
Then every check of one end: the job ended exactly once, by the other run; the output reads
back whole; nothing of the job changed after its SUCCESS; one ledger record, the other run's;
the count marked by the other run; one ``succeeded`` webhook; the zombie's log says it lost its
lease and stopped without an end.

``call(fn)`` runs each step that talks to Redis or S3 (a partition test runs them inside the
services' network namespace); ``lose(host)`` and ``heal(host)`` make and end the fault.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import redis

from producer.state import keys
from producer.wire.spec import JobResult, JobSpec, NotifySpec, Progress
from tests.e2e.chaos_helpers import Jobs, mid_job, received, succeeded, wait_for
from tests.e2e.helpers import pattern_spec, verify_output
from tests.e2e.hosts import Host
from tests.receiver import Receiver

T = TypeVar("T")
HEALS = ("after-success", "mid-run")
#: 237 frames of 768x512 in 10 segments: the other run is still decoding 2 s after its start.
JOB = {"latent_frames": 60, "h": 64, "w": 96, "segment_frames": 24}


def here(fn: Callable[[], T]) -> T:
    return fn()


@dataclass
class Stage:
    """One fleet of two ``hosts`` and what the checks read: the ``jobs`` (a client of the
    fleet's Redis), a ``receiver`` of the jobs' webhooks, the fleet's ``redis_url``, S3."""

    hosts: list[Host]
    jobs: Jobs
    receiver: Receiver
    redis_url: str
    tmp: Path
    call: Callable[[Callable[[], Any]], Any] = here

    def run(self, job_id: str, input_uri: str, heal: str, lose: Callable[[Host], None],
            come_back: Callable[[Host], None], spec: JobSpec | None = None) -> None:
        """One job through a zombie, healed at ``heal``; every check of one end. ``spec``: a
        job of its own (a generate job, lost mid-denoise); default: the pattern decoder on
        ``input_uri``, lost mid-upload."""
        jobs, call = self.jobs, self.call
        notify = NotifySpec(urls=(self.receiver.url(),))
        spec = (pattern_spec(job_id, input_uri, jobs.bucket, segment_frames=JOB["segment_frames"],
                             time_limit_s=600, notify=notify) if spec is None
                else spec.model_copy(update={"job_id": job_id, "notify": notify}))
        jobs.specs[job_id], jobs.handles[job_id] = spec, call(lambda: jobs.client.submit(spec))
        # Given a host in the middle of the job: a segment or more uploaded, or denoising
        midway = partial(mid_denoise, jobs, job_id) if spec.generate is not None else partial(
            mid_job, jobs, [job_id], at_least=0.25)
        call(lambda: wait_for(midway, 120, f"{job_id} mid-way"))
        node = call(lambda: jobs.meta(job_id)["worker"])
        zombie = next(h for h in self.hosts if h.nodename == node)
        other = next(h for h in self.hosts if h is not zombie)
        # When it loses the fleet longer than the lease: taken for lost, the job runs elsewhere
        lose(zombie)
        lost_at = time.monotonic()
        wait_for(lambda: received([other], job_id) >= 1, 90, f"{job_id} delivered again")
        detected = time.monotonic() - lost_at
        if heal == "mid-run":
            call(lambda: wait_for(lambda: jobs.meta(job_id).get("worker") == other.nodename,
                                  60, f"{job_id} running on {other.host}"))
            time.sleep(2.0)
            come_back(zombie)
        result = call(lambda: jobs.handles[job_id].wait(timeout=180, poll_s=0.2))
        done, recovered = datetime.now(UTC), time.monotonic() - lost_at
        if heal == "after-success":
            come_back(zombie)
        healed_at = time.monotonic()
        # Then, once the zombie's run is over (it stops, or, unfenced, ends the job again) ...
        stopped = f"job {job_id}: this run stopped without an end"
        wait_for(lambda: stopped in zombie.log_text() or succeeded([zombie], job_id), 90,
                 f"the zombie's run over ({zombie.host})")
        print(f"zombie {job_id} ({heal}): delivered again {detected:.1f} s after the fault, "
              f"SUCCESS {recovered:.1f} s after it; the zombie stopped "
              f"{time.monotonic() - healed_at:.1f} s after the heal")
        time.sleep(3.0)  # anything it still had in flight has had its chance to land
        call(lambda: self.check_one_end(job_id, other, result, done))
        ends = [x for x in self.receiver.received if x.json["job_id"] == job_id
                and x.json["event"] == "succeeded"]
        assert len(ends) == 1, [x.json for x in ends]
        assert ends[0].json["data"]["result"]["worker"]["node"] == other.nodename
        # ... and the zombie's log says it lost its lease and stopped without an end
        assert f"job {job_id}: this run (generation" in zombie.log_text()
        assert "lost its lease" in zombie.log_text() and stopped in zombie.log_text()

    def check_one_end(self, job_id: str, other: Host, result: JobResult, done: datetime) -> None:
        """The job ended once, by ``other``'s run, and nothing of it changed after ``done``."""
        jobs, s3, bucket = self.jobs, self.jobs.s3, self.jobs.bucket
        meta = jobs.meta(job_id)
        assert meta["status"] == "SUCCESS", meta
        assert result.worker.node == other.nodename and succeeded(self.hosts, job_id) == 1
        # (the pattern's frames carry their index; a generate job's decode to their count,
        # beside its previews)
        generated = jobs.specs[job_id].generate is not None
        verify_output(s3, bucket, result, self.tmp, besides=("ledger.json",),
                      indexed=not generated, previews=generated)
        # Nothing changed after the SUCCESS (the zombie rewrote the playlist and the manifest
        # then, without fencing); the playlist is the ended one
        changed = {k: t for k, t in _objects(s3, bucket, f"out/default/{job_id}/").items()
                   if (t - done).total_seconds() > 1.5}
        assert not changed, changed
        playlist = s3.client().get_object(Bucket=bucket, Key=f"out/default/{job_id}/index.m3u8")
        text = playlist["Body"].read().decode()
        assert text.rstrip().endswith("#EXT-X-ENDLIST") and text.count("#EXTINF") == len(
            result.manifest.segments)
        # One ledger record, the other run's, and its count marked by the other run
        records = [k for k in _objects(s3, bucket, "ledger/") if f"-{job_id}-" in k]
        assert len(records) == 1, records
        body = s3.client().get_object(Bucket=bucket, Key=records[0])["Body"].read()
        assert json.loads(body)["node"] == other.nodename
        r = redis.Redis.from_url(self.redis_url)
        by = r.hget(keys.runs(job_id), f"{keys.COUNTED_END_FIELD}:by")
        r.close()
        assert by is not None and other.nodename in by.decode(), by


def mid_denoise(jobs: Jobs, job_id: str) -> bool:
    """``job_id``'s run reports denoise steps, some done and some to come."""
    meta = jobs.meta(job_id)
    info = meta.get("result")
    if meta.get("status") != "PROGRESS" or not isinstance(info, dict):
        return False
    p = Progress.model_validate(info)
    return p.stage == "denoise" and 0 < p.steps_done < p.steps_total


def _objects(s3: Any, bucket: str, prefix: str) -> dict[str, datetime]:
    listed = s3.client().list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return {o["Key"]: o["LastModified"] for o in listed}
