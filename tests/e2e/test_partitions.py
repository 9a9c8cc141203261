"""Chaos: partitions. Real worker hosts, each in its own network namespace, lose a network
path while every process of them lives (``tests/e2e/netns.py``: ``iptables`` DROP inside the
host's namespace; Redis, SeaweedFS and a webhook receiver in the services' namespace).

- A host cut from Redis in the middle of a job's upload, longer than the lease: taken for
  lost, its job runs on the other host; healed after the job's SUCCESS (``make chaos``: also
  2 s after the other run started), the zombie writes nothing and logs why
  (``tests/e2e/zombies.py`` checks one end).
- A host cut from S3 only keeps its lease (it reaches Redis): its uploads fail and are retried
  until the path heals; the job ends once, whole.

``make test`` runs the first case healed after SUCCESS; ``make chaos`` every case, ``RUNS``
times.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.e2e.chaos_helpers import FULL, RUNS, mid_job, wait_for
from tests.e2e.helpers import pattern_spec
from tests.e2e.hosts import Host
from tests.e2e.netns import Lab, require_lab
from tests.e2e.partition_fleet import partition_stage
from tests.e2e.zombies import HEALS, JOB, Stage

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]


@pytest.fixture
def lab_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Lab, Stage]]:
    require_lab()
    with partition_stage(tmp_path, monkeypatch) as both:
        yield both


def _ns(host: Host) -> str:
    return host.host.removeprefix("part")


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


@pytest.mark.timeout(420 * RUNS)
@pytest.mark.parametrize("heal", HEALS if FULL else HEALS[:1])
def test_a_host_cut_from_redis_is_a_zombie_that_writes_nothing(
        lab_stage: tuple[Lab, Stage], heal: str) -> None:
    lab, stage = lab_stage
    redis_port = _port(stage.redis_url)
    uri = stage.call(lambda: stage.jobs.put_input("cut", JOB))
    for run in range(RUNS):
        stage.run(f"cut-redis-{heal}-{run}", uri, heal,
                  lambda h: lab.cut(_ns(h), redis_port), lambda h: lab.heal(_ns(h)))


@pytest.mark.timeout(300 * RUNS)
@pytest.mark.skipif(not FULL, reason="make chaos only (FRAMEFLEET_CHAOS_FULL=1)")
def test_a_host_cut_from_s3_keeps_its_job_and_ends_it_once(
        lab_stage: tuple[Lab, Stage]) -> None:
    lab, stage = lab_stage
    uri = stage.call(lambda: stage.jobs.put_input("s3cut", JOB))
    for run in range(RUNS):
        _cut_from_s3(lab, stage, f"cut-s3-{run}", uri)


def _cut_from_s3(lab: Lab, stage: Stage, job_id: str, uri: str) -> None:
    jobs, call = stage.jobs, stage.call
    spec = pattern_spec(job_id, uri, jobs.bucket, segment_frames=JOB["segment_frames"],
                        time_limit_s=600)
    jobs.specs[job_id], jobs.handles[job_id] = spec, call(lambda: jobs.client.submit(spec))
    call(lambda: wait_for(lambda: mid_job(jobs, [job_id], at_least=0.25), 120,
                          f"{job_id} mid-way"))
    node = call(lambda: jobs.meta(job_id)["worker"])
    host = next(h for h in stage.hosts if h.nodename == node)
    # When its host loses S3 for 15 s (its Redis path, and so its lease, stay)
    lab.cut(_ns(host), _port(jobs.s3.endpoint_url))
    time.sleep(15.0)
    lab.heal(_ns(host))
    # Then the job ends once, whole, and nothing of it changes after
    result = call(lambda: jobs.handles[job_id].wait(timeout=240, poll_s=0.2))
    done = datetime.now(UTC)
    time.sleep(3.0)
    ender = next(h for h in stage.hosts if h.nodename == result.worker.node)
    call(lambda: stage.check_one_end(job_id, ender, result, done))
