"""Chaos: partitions. Real worker hosts, each in its own network namespace, lose a network
path while every process of them lives (``tests/e2e/netns.py``: ``iptables`` DROP inside the
host's namespace; Redis, SeaweedFS and a webhook receiver in the services' namespace).

- A host cut from Redis in the middle of a job's upload, longer than the lease: taken for
  lost, its job runs on the other host; healed after the job's SUCCESS (``make chaos``: also
  2 s after the other run started), the zombie writes nothing and logs why
  (``tests/e2e/zombies.py`` checks one end).
- The same mid-denoise (a generate job of the tiny model), healed after SUCCESS.
- A host cut from S3 only keeps its lease (it reaches Redis): its uploads fail and are retried
  until the path heals; the job ends once, whole.
- The gateway cut from Redis answers 503 with ``Retry-After``; a client cut from Redis while
  it submits fails naming the broker, and nothing is queued; healed, each job runs once.
- A slow link to S3: the ring holds the decode back, the job succeeds in its time limit, and
  the cost report charges the wait to ``upload_wait``.

``make test`` runs the first case healed after SUCCESS and the gateway's and client's; ``make
chaos`` every case, ``RUNS`` times.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from producer.client import Client
from producer.errors import BrokerError
from producer.wire.spec import JobSpec, OutputSpec, VideoSpec
from tests.e2e.api_fleet import call
from tests.e2e.chaos_helpers import FULL, RUNS, mid_job, received, succeeded, wait_for
from tests.e2e.helpers import pattern_spec, put_latents
from tests.e2e.hosts import Host
from tests.e2e.netns import SERVICES, Lab, require_lab
from tests.e2e.partition_fleet import edge_stage, partition_stage
from tests.e2e.zombies import HEALS, JOB, Stage
from tests.worker.generate.tiny import tiny_generate
from worker.generate.model.tiny import write_tiny

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]
SMALL = {"latent_frames": 6, "h": 32, "w": 40}


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


@pytest.mark.timeout(420 * RUNS)
@pytest.mark.skipif(not FULL, reason="make chaos only (FRAMEFLEET_CHAOS_FULL=1)")
def test_a_host_cut_from_redis_mid_denoise_is_a_zombie_that_writes_nothing(
        lab_stage: tuple[Lab, Stage], tmp_path: Path) -> None:
    lab, stage = lab_stage
    redis_port = _port(stage.redis_url)
    model = tmp_path / "tiny-wan"
    write_tiny(model, "t2v")
    # 400 steps of the tiny model: tens of seconds of denoise on these cores
    spec = JobSpec(job_id="denoise", generate=tiny_generate(model, num_inference_steps=400),
                   output=OutputSpec(uri=f"s3://{stage.jobs.bucket}/out"),
                   video=VideoSpec(segment_frames=4), time_limit_s=600)
    for run in range(RUNS):
        stage.run(f"cut-denoise-{run}", "", "after-success",
                  lambda h: lab.cut(_ns(h), redis_port), lambda h: lab.heal(_ns(h)), spec=spec)


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


@pytest.mark.timeout(300)
@pytest.mark.skipif(not FULL, reason="make chaos only (FRAMEFLEET_CHAOS_FULL=1)")
def test_a_slow_link_to_s3_holds_the_ring_and_charges_the_wait_to_the_upload(
        lab_stage: tuple[Lab, Stage]) -> None:
    lab, stage = lab_stage
    jobs, call = stage.jobs, stage.call
    # Given both hosts' path to S3 throttled below what the job makes (32 kbit/s, for the
    # pattern's lossless segments of ~4 kB; Redis as fast as ever)
    for ns in lab.hosts:
        lab.throttle(ns, _port(jobs.s3.endpoint_url), "32kbit")
    uri = call(lambda: jobs.put_input("slow", JOB))
    spec = pattern_spec("slow-link", uri, jobs.bucket, segment_frames=12, time_limit_s=240)
    # Lossless: the pattern compresses to almost nothing otherwise
    spec = spec.model_copy(update={"video": spec.video.model_copy(update={"crf": 0})})
    jobs.specs["slow-link"] = spec
    t0 = time.monotonic()
    handle = call(lambda: jobs.client.submit(spec))
    # When the job runs, Then it succeeds within its time limit ...
    result = call(lambda: handle.wait(timeout=260, poll_s=0.5))
    took = time.monotonic() - t0
    assert took < spec.time_limit_s
    # ... its frame ring held the decode back (bounded memory) while segments crawled out ...
    timings = result.timings
    stored = sum(seg.bytes for seg in result.manifest.segments)
    assert timings.backpressure_s > 0 and timings.upload_s > 1.0, (stored, timings)
    # ... and its cost report charges the wait to the upload, not to the decode
    assert result.cost is not None
    stages = {s.stage: s for s in result.cost.stages}
    assert stages["upload_wait"].gpu_seconds > 1.0, stages
    stored = sum(seg.bytes for seg in result.manifest.segments)
    print(f"slow link (32 kbit/s to S3): {took:.1f} s, {result.manifest.frames} frames, "
          f"{stored / 1e6:.1f} MB, "
          f"upload {timings.upload_s:.1f} s, ring wait {timings.backpressure_s:.1f} s, "
          f"upload_wait {stages['upload_wait'].gpu_seconds:.1f} of "
          f"{result.cost.gpu_seconds:.1f} GPU-s")


@pytest.fixture
def edge(tmp_path: Path) -> Iterator[dict[str, Any]]:
    require_lab()
    with edge_stage(tmp_path) as stage:
        yield stage


@pytest.mark.timeout(300)
def test_the_gateway_and_a_client_cut_from_redis_refuse_clearly_and_queue_once(
        edge: dict[str, Any]) -> None:
    lab, gateway, key = edge["lab"], edge["gateway"], edge["key"]
    cli, redis_port = lab.hosts["cli"], _port(edge["redis"].url)
    uri = lab.services.run(lambda: put_latents(edge["s3"], edge["bucket"],
                                               "in/acme/clip.safetensors", **SMALL))
    body = json.dumps({"job_id": "edge-api", "input": {"uri": uri},
                       "decoder": {"name": "pattern"}}).encode()
    post = partial(call, gateway.url, "/v1/jobs", key, "POST",
                   {"Content-Type": "application/json"}, body)
    # Given the gateway cut from Redis: a clear 503 with Retry-After, no 500, in bounded time
    lab.cut("gw", redis_port)
    t0 = time.monotonic()
    status, headers, answer = cli.run(post)
    assert status == 503 and headers.get("Retry-After"), (status, answer)
    assert json.loads(answer)["error"]["code"] == "fleet_unavailable"
    assert time.monotonic() - t0 < 30
    # When the path heals, the same request queues the job, once, and it runs
    lab.heal("gw")
    status, _, answer = cli.run(post)
    assert status in (200, 201, 202), answer
    job = json.loads(answer)["job_id"]
    api_key = job if ":" in job else f"acme:{job}"
    # Given a client cut from Redis while it submits: it fails naming the broker, in bounded
    # time, and nothing is claimed or queued
    client = cli.run(lambda: Client(broker_url=edge["redis"].url,
                                    backend_url=edge["redis"].url))
    spec = pattern_spec("edge-cli", uri, edge["bucket"], segment_frames=12)
    lab.cut("cli", redis_port)
    t0 = time.monotonic()
    with pytest.raises(BrokerError, match=SERVICES):
        cli.run(lambda: client.submit(spec))
    assert time.monotonic() - t0 < 60
    lab.heal("cli")
    # Then submitted again it is sent once, and both jobs end once, on the worker
    handle = cli.run(lambda: client.submit(spec))
    result = cli.run(lambda: handle.wait(timeout=120, poll_s=0.2))
    assert result.manifest.frames > 0
    api_job = cli.run(lambda: client.get(api_key).wait(timeout=120, poll_s=0.2))
    assert api_job.manifest.frames > 0
    host = edge["host"]
    assert (received([host], "edge-cli"), succeeded([host], "edge-cli")) == (1, 1)
    assert succeeded([host], api_key) == 1
