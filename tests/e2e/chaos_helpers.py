"""Steps shared by the chaos tests: counts, worker settings, finding and killing a job's process.

Every wait is bounded and polls; nothing here sleeps for a fixed "long enough".
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import psutil
import redis

from producer.app import TASK_NAME
from producer.client import Client, JobHandle
from producer.wire.spec import JobResult, JobSpec, Progress, segment_name
from tests.e2e.helpers import pattern_spec, put_latents, verify_output
from tests.services import WorkerProcess
from tests.waiting import wait_for

T = TypeVar("T")

#: ``make chaos`` sets it: full counts instead of the reduced ones ``make test`` runs.
FULL = os.environ.get("FRAMEFLEET_CHAOS_FULL", "").lower() in {"1", "true", "yes"}
#: Runs in a row of each case that loops (``make chaos``: 20, or FRAMEFLEET_CHAOS_RUNS; else 1):
#: a loss one run in ten is a loss, and one run does not show it.
RUNS = int(os.environ.get("FRAMEFLEET_CHAOS_RUNS") or (20 if FULL else 1))

#: The smallest delivery settings ``producer/settings`` allows: a job may run 60 s, and a
#: message a dead worker held is visible again 61 s after it was delivered.
VISIBILITY_S = 61
#: What kombu's Redis transport waits between two sweeps for such messages: a sweep every
#: ``unacked_restore_interval`` (10 s) tick, but only every ``unacked_restore_throttle`` (10th)
#: tick scans; a worker also scans once when it starts.
SWEEP_S = 100

CHAOS_ENV = {
    "FRAMEFLEET_DEVICE": "cpu",
    "FRAMEFLEET_MAX_TIME_LIMIT_S": "60",
    "FRAMEFLEET_VISIBILITY_TIMEOUT_S": str(VISIBILITY_S),
    # Retries come back fast, and no retry waits longer than the visibility timeout (a
    # countdown is an ETA message the worker holds unacked: past the timeout it is delivered
    # a second time).
    "FRAMEFLEET_RETRY_BACKOFF_S": "0.5",
    "FRAMEFLEET_RETRY_BACKOFF_MAX_S": "8",
    "FRAMEFLEET_RETRY_MAX": "8",
    # Several workers on one host: no /metrics listener (it would bind a fixed port).
    "FRAMEFLEET_METRICS_PORT": "0",
    # Two workers share two cores: torch's intra-op threads would spin against the encoder
    # threads and the other worker (the CPU post-process ran 3x slower under load with 2).
    "OMP_NUM_THREADS": "1",
}

#: A job long enough (≈ 2-4 s on a loaded 2-core machine) that a kill lands mid-job:
#: 237 frames of 512x384 in 10 segments.
LONG_JOB = {"latent_frames": 60, "h": 48, "w": 64, "segment_frames": 24}
#: A small job for load: 21 frames of 320x256 in 2 segments.
SMALL_JOB = {"latent_frames": 6, "h": 32, "w": 40, "segment_frames": 12}


def count(reduced: int, full: int) -> int:
    """``full`` under ``make chaos`` (FRAMEFLEET_CHAOS_FULL=1), else ``reduced``."""
    return full if FULL else reduced


@dataclass
class Jobs:
    """The jobs of one test: their specs, handles and the latents they share."""

    client: Client
    s3: Any
    bucket: str
    specs: dict[str, JobSpec] = field(default_factory=dict)
    handles: dict[str, JobHandle] = field(default_factory=dict)

    def put_input(self, name: str, shape: dict[str, int]) -> str:
        return put_latents(self.s3, self.bucket, f"in/{name}.safetensors",
                           latent_frames=shape["latent_frames"], h=shape["h"], w=shape["w"])

    def submit(self, job_id: str, input_uri: str, shape: dict[str, int]) -> JobHandle:
        spec = pattern_spec(job_id, input_uri, self.bucket,
                            segment_frames=shape["segment_frames"], time_limit_s=50)
        self.specs[job_id] = spec
        handle = self.client.submit(spec)
        self.handles[job_id] = handle
        return handle

    def meta(self, job_id: str) -> dict[str, Any]:
        return dict(self.client.app.backend.get_task_meta(job_id))

    def metas(self, job_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Result-backend metadata of many jobs in one round trip (polling loops)."""
        backend = self.client.app.backend
        raw = backend.client.mget([backend.get_key_for_task(j) for j in job_ids])
        return {j: dict(backend.decode_result(v)) if v else {"status": "PENDING"}
                for j, v in zip(job_ids, raw, strict=True)}

    def wait_all(self, timeout: float) -> dict[str, JobResult]:
        """Every job's result, waiting at most ``timeout`` s for all of them together."""
        deadline = time.monotonic() + timeout
        return {
            job_id: handle.wait(timeout=max(1.0, deadline - time.monotonic()), poll_s=0.1)
            for job_id, handle in self.handles.items()
        }


def mid_job(jobs: Jobs, job_ids: Sequence[str], node: str | None = None, at_least: float = 0.0
            ) -> tuple[str, Progress] | None:
    """A job among ``job_ids`` that has decoded some but not all of its frames (on ``node``),
    and at least the fraction ``at_least`` of them."""
    for job_id, meta in jobs.metas(job_ids).items():
        info = meta.get("result")
        if meta.get("status") != "PROGRESS" or not isinstance(info, dict):
            continue
        if node is not None and meta.get("worker") != node:
            continue
        p = Progress.model_validate(info)
        if 0 < p.frames_done < p.frames_total and p.frames_done >= at_least * p.frames_total:
            return job_id, p
    return None


def running_node(jobs: Jobs, job_id: str) -> str:
    """The nodename (``w1@host``) of the worker that last reported progress of ``job_id``."""
    return str(jobs.meta(job_id).get("worker"))


def pool_child(worker: WorkerProcess) -> psutil.Process:
    """The one prefork pool process (ForkPoolWorker) of a ``-c 1`` worker."""
    children = psutil.Process(worker.pid).children()
    assert len(children) == 1, f"{worker.worker_name}: pool processes {children}"
    return children[0]


def kill_pool_child(worker: WorkerProcess) -> int:
    """SIGKILL the pool process only (Celery sees WorkerLostError); return its PID."""
    child = pool_child(worker)
    os.kill(child.pid, signal.SIGKILL)
    return child.pid


def new_pool_child(worker: WorkerProcess, old_pid: int, timeout: float = 30.0) -> int:
    """Wait until the worker has replaced the pool process ``old_pid``; return the new PID."""

    def check() -> int | None:
        children = psutil.Process(worker.pid).children()
        fresh = [c.pid for c in children if c.pid != old_pid and c.is_running()]
        return fresh[0] if fresh else None

    return wait_for(check, timeout, f"new pool process of {worker.worker_name}")


def wait_received(workers: Sequence[WorkerProcess], job_id: str, times: int,
                  timeout: float) -> None:
    """Wait until ``workers`` received ``job_id`` ``times`` times (counting every log)."""
    wait_for(lambda: received(workers, job_id) >= times, timeout,
             f"delivery {times} of {job_id}")


def wait_gone(process: psutil.Process, timeout: float) -> None:
    """Wait until ``process`` has exited (a zombie counts: it runs nothing)."""
    wait_for(lambda: not process.is_running() or process.status() == psutil.STATUS_ZOMBIE,
             timeout, f"exit of process {process.pid}")


def _task_lines(workers: Sequence[WorkerProcess], job_id: str, what: str) -> int:
    pattern = re.compile(rf"Task {re.escape(TASK_NAME)}\[{re.escape(job_id)}\] {what}")
    return sum(len(pattern.findall(w.log_text())) for w in workers)


def received(workers: Sequence[WorkerProcess], job_id: str) -> int:
    """How many times any of ``workers`` received ``job_id`` (deliveries and retries)."""
    return _task_lines(workers, job_id, "received")


_STAMP = r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): INFO/MainProcess\] "


def story(workers: Sequence[WorkerProcess], job_id: str, limit: int = 60) -> str:
    """Every log line of ``workers`` that names ``job_id`` or a lapsed lease or a held-off
    sweep, by worker: what an assertion on deliveries prints when it fails."""
    words = (job_id, "lease", "sweep", "connection", "Connection")
    parts = []
    for w in workers:
        lines = [line for line in w.log_text().splitlines() if any(k in line for k in words)]
        parts.append(f"--- {w.nodename}:\n" + "\n".join(lines[-limit:]))
    return "\n".join(parts)


def received_at(workers: Sequence[WorkerProcess], job_id: str) -> list[float]:
    """Unix times (from the worker logs) at which ``job_id`` was received, sorted."""
    pattern = re.compile(
        _STAMP + rf"Task {re.escape(TASK_NAME)}\[{re.escape(job_id)}\] received", re.M
    )
    return sorted(
        datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        for w in workers for m in pattern.finditer(w.log_text())
    )


def redelivered_after(workers: Sequence[WorkerProcess], job_id: str, killed: float) -> float:
    """Seconds from ``killed`` (unix time) to the next delivery of ``job_id``."""
    later = [t for t in received_at(workers, job_id) if t > killed]
    assert later, f"{job_id} was not delivered again after the kill"
    return later[0] - killed


def succeeded(workers: Sequence[WorkerProcess], job_id: str) -> int:
    """How many executions of ``job_id`` ended in success, over every worker's log."""
    return _task_lines(workers, job_id, "succeeded")


def retried(workers: Sequence[WorkerProcess], job_id: str) -> int:
    """How many times ``job_id`` was put back for a retry (Celery's ``retry:`` log line)."""
    return _task_lines(workers, job_id, "retry:")


def assert_exactly_once(
    jobs: Jobs, results: dict[str, JobResult], workers: Sequence[WorkerProcess], tmp: Path,
    verify: Iterable[str] | None = None,
) -> None:
    """Every job: SUCCESS, one successful execution, manifest complete, every frame checked.

    ``verify`` names the jobs whose frames are decoded and checked (default: all); the others
    still have their manifest and every segment's size and hash checked against the listing.
    """
    assert set(results) == set(jobs.specs)
    check_frames = set(jobs.specs if verify is None else verify)
    for job_id, result in results.items():
        assert jobs.handles[job_id].status() == "SUCCESS", job_id
        assert result.manifest.job_id == job_id and not result.reused, (job_id, result.reused)
        assert succeeded(workers, job_id) == 1, (
            f"{job_id}: {succeeded(workers, job_id)} successful executions"
        )
        if job_id in check_frames:
            verify_output(jobs.s3, jobs.bucket, result, tmp)
        else:
            verify_listing(jobs.s3, jobs.bucket, result)


def assert_broker_drained(url: str, timeout: float = 10.0) -> None:
    """No message left in a queue or held unacked: nothing will be delivered again later.

    An ack lost to a dropped connection leaves the message in kombu's ``unacked`` hash, and
    Redis restores it after the visibility timeout: a second run long after the test ended.
    """
    client = redis.Redis.from_url(url)
    try:
        def check() -> bool:
            queued = sum(int(client.llen(k)) for k in client.scan_iter(match="video*"))
            return queued == 0 and int(client.hlen("unacked")) == 0

        wait_for(check, timeout, "empty queues and no unacked message")
    finally:
        client.close()


def verify_listing(s3: Any, bucket: str, result: JobResult) -> None:
    """The cheap half of ``verify_output``: manifest == result, and exactly its objects exist."""
    client = s3.client()
    manifest = result.manifest
    prefix = f"out/{manifest.tenant}/{manifest.job_id}/"
    listed = {o["Key"]: o["Size"] for o in
              client.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]}
    expected = {prefix + segment_name(s.index): s.bytes for s in manifest.segments}
    manifest_key = prefix + "manifest.json"
    assert listed.pop(manifest_key, None) is not None, f"{manifest.job_id}: no manifest"
    assert listed.pop(prefix + "index.m3u8", None) is not None, f"{manifest.job_id}: no playlist"
    assert listed == expected, (manifest.job_id, listed, expected)
    assert sum(s.frames for s in manifest.segments) == manifest.frames
