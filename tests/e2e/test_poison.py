"""The poison cap, end to end: a job that kills its worker every time it runs ends in FAILURE
after ``FRAMEFLEET_MAX_WORKER_LOSSES`` deliveries, and the fleet goes on with the next job.

Real Redis, SeaweedFS and a Celery worker. The test itself is the poison: each time a run of
the job has started (it holds the job's lease and has reported progress) the test SIGKILLs
the pool process that runs it, as the OOM killer or a segfaulting decoder would. No hook in
the worker is needed.
"""

from __future__ import annotations

import os
import re
import signal
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis

from producer.client import Client
from producer.errors import JobFailed
from producer.settings import Settings
from producer.state import keys
from tests.e2e.chaos_helpers import (
    CHAOS_ENV,
    LONG_JOB,
    SMALL_JOB,
    Jobs,
    assert_broker_drained,
    assert_exactly_once,
    received,
    wait_for,
)
from tests.services import WorkerProcess

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]

#: The default cap, which the worker below runs with.
CAP = int(Settings.model_fields["max_worker_losses"].default)


@pytest.fixture
def client(redis_url: str) -> Client:
    redis.Redis.from_url(redis_url).flushdb()  # no job or unacked message of an earlier test
    return Client(broker_url=redis_url, backend_url=redis_url)


def started_run(jobs: Jobs, r: redis.Redis, worker: WorkerProcess, job_id: str,
                killed: list[int]) -> int | None:
    """The PID of a pool process of ``worker`` that runs ``job_id`` now and was not killed
    yet: it holds the job's lease (``node pid token``), has recorded its run (the record the
    cap counts: killed before, the run would not count, and the job would run on to SUCCESS),
    and the job has listed a segment.

    Events only: the lease, the run record and the job's state, whatever the load."""
    holder = r.get(keys.lease(job_id))
    running = r.hget(keys.runs(job_id), "running")
    meta = jobs.meta(job_id)
    if holder is None or running is None or meta.get("status") != "PROGRESS":
        return None
    if not (isinstance(meta.get("result"), dict) and meta["result"].get("segments_done")):
        return None
    pid = int(holder.decode().split(" ")[1])
    if int(running.decode().split(" ")[1]) != pid:  # the record of a run before this one
        return None
    children = {c.pid for c in psutil.Process(worker.pid).children()}
    return pid if pid not in killed and pid in children else None


# Every wait is on an event (a lease, a run record, a job state, a log line); the bounds are
# only there to fail a broken build, and are wide for a loaded 2-core CI machine.
@pytest.mark.timeout(600)
def test_a_job_that_kills_its_worker_every_time_fails_after_the_cap(
    client: Client, worker_factory: Any, s3: Any, s3_bucket: str, tmp_path: Path
) -> None:
    # Given one worker with the default cap, and a job that kills every worker it runs on
    (worker,) = worker_factory(1, env=CHAOS_ENV)
    r = redis.Redis.from_url(client.app.conf.broker_url)
    jobs = Jobs(client, s3, s3_bucket)
    job_id = "poison"
    jobs.submit(job_id, jobs.put_input("long", LONG_JOB), LONG_JOB)
    killed: list[int] = []
    for n in range(1, CAP + 1):
        pid = wait_for(partial(started_run, jobs, r, worker, job_id, killed), 120,
                       f"run {n} of {job_id}", detail=lambda: worker.log_text()[-3000:])
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)
        print(f"poison: run {n} of {job_id} killed (pool process {pid})")
    # When it is delivered once more
    meta = wait_for(lambda: (m := jobs.meta(job_id))["status"] in {"SUCCESS", "FAILURE"} and m,
                    120, f"end of {job_id}", detail=lambda: worker.log_text()[-3000:])
    # Then it ends in FAILURE without running, saying why and naming the node it died on
    assert meta["status"] == "FAILURE", meta
    with pytest.raises(JobFailed) as failed:
        jobs.handles[job_id].result()
    message = str(failed.value)
    assert f"lost {CAP} times" in message and "MAX_WORKER_LOSSES" in message, message
    assert str(worker.nodename) in message, message
    assert received([worker], job_id) == CAP + 1
    # (the main process logs a loss after it has requeued the message: wait for the line)
    lost_line = "WorkerLostError: Worker exited prematurely: signal 9"
    wait_for(lambda: worker.log_text().count(lost_line) >= CAP, 60, f"{CAP} worker losses logged")
    assert worker.log_text().count(lost_line) == CAP
    print(f"poison: {message}")
    # and the live playlist its killed runs left open is ended, at the segments they listed
    prefix = f"out/default/{job_id}/"
    text = s3.client().get_object(Bucket=s3_bucket, Key=prefix + "index.m3u8")["Body"].read()
    playlist = text.decode()
    segments = re.findall(r"^segment-\d+\.mp4$", playlist, re.M)
    assert 1 <= len(segments) < 10 and playlist.endswith("\n#EXT-X-ENDLIST\n"), playlist
    assert playlist.count("#EXT-X-ENDLIST") == 1
    stored = s3.client().list_objects_v2(Bucket=s3_bucket, Prefix=prefix)["Contents"]
    assert prefix + "manifest.json" not in {o["Key"] for o in stored}
    print(f"poison: the playlist lists {len(segments)} segments, then EXT-X-ENDLIST")
    # and the same worker runs the next job, with all its frames
    jobs.specs.pop(job_id)
    jobs.handles.pop(job_id)
    jobs.submit("after-poison", jobs.put_input("small", SMALL_JOB), SMALL_JOB)
    results = jobs.wait_all(timeout=120)
    assert_exactly_once(jobs, results, [worker], tmp_path)
    assert_broker_drained(client.app.conf.broker_url)
