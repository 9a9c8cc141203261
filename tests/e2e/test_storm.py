"""Chaos: a storm of tiny jobs through the gateway and the Python client onto three CPU workers
on two hosts, while faults drawn from one seed hit every part of the fleet.

Real Redis (append-only, every write fsynced), SeaweedFS, two gateway replicas (``framefleet
api``), and two "hosts" (``tests/e2e/hosts.py``: ``python -m worker --cpu N`` in a process
group of its own; one runs two workers, the other one). Jobs: the pattern decoder on tiny
latents of three shapes, half posted to ``/v1/jobs`` of a gateway replica, half submitted with
``producer.client.Client``. Faults, at times drawn from the seed (printed first; rerun one
with ``FRAMEFLEET_STORM_SEED=…``): SIGKILL a pool process, SIGKILL a whole host (started again
3 s later), SIGKILL Redis and start it again, stop SeaweedFS and start it again, pause it
(SIGSTOP, 4 s, SIGCONT), restart a gateway replica, cancel some jobs.

At the end: every job in a final state, none lost; each SUCCESS has one output whose segments
are identical (sha256) to a fault-free in-process run of its shape; the ledger holds one record
per job; the workers' ``framefleet_jobs_total`` never counts more ends than there were (counts
of a process killed within a scrape period are missed: they die with it); no playlist of a
final job left without ``#EXT-X-ENDLIST``; nothing written outside ``out/`` and ``ledger/``.

``make chaos`` (FRAMEFLEET_CHAOS_FULL=1): 500 jobs, 16 faults, ``bench/results/storm-cpu.md``;
``make test``: a smoke storm (30 jobs, 4 faults)."""

from __future__ import annotations

import hashlib
import io
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from producer.client import Client
from producer.errors import BrokerError
from producer.ports import CPU_PORT_OFFSET
from producer.settings import Settings
from producer.wire.results import LedgerRecord
from producer.wire.spec import JobSpec
from tests.e2e.api_fleet import post_json
from tests.e2e.chaos_helpers import CHAOS_ENV, FULL, received_at
from tests.e2e.hosts import Host
from tests.e2e.storm import (
    END,
    FULL_FAULTS,
    SHAPES,
    SMOKE_FAULTS,
    Fault,
    Plan,
    Scraper,
    StormJob,
    latents,
    ledger_problems,
    reference_hashes,
    results_md,
    seed_from_env,
    submit_at,
    summary,
)
from tests.gateway import GatewayProcess, write_keys, write_models
from tests.require import require_binary
from tests.services import (
    REDIS_INSTALL,
    REPO_ROOT,
    WEED_INSTALL,
    RedisServer,
    S3Server,
    free_ports,
)
from worker.generate.model.tiny import write_tiny

pytestmark = [pytest.mark.chaos, pytest.mark.e2e, pytest.mark.timeout(900 if FULL else 240),
              pytest.mark.usefixtures("file_roots")]

N_JOBS, FAULTS = (500, FULL_FAULTS) if FULL else (30, SMOKE_FAULTS)
#: Faults land in this window after the first submit.
WINDOW_S = 150.0 if FULL else 15.0
#: Every job final within this long after the last fault.
SETTLE_S = 420.0 if FULL else 150.0
FINAL, TENANT = {"SUCCESS", "FAILURE", "REVOKED"}, "acme"
RESULTS = REPO_ROOT / "bench" / "results" / "storm-cpu.md"


class Storm:
    """The fleet and the jobs of one storm."""

    def __init__(self, tmp: Path, plan: Plan) -> None:
        self.tmp, self.plan = tmp, plan
        self.redis = RedisServer(require_binary("redis-server", REDIS_INSTALL), tmp / "redis",
                                 appendonly=True)
        self.s3 = S3Server(require_binary("weed", WEED_INSTALL), tmp / "s3")
        self.bucket, self.hosts, self.gateways = "storm", list[Host](), list[GatewayProcess]()
        self.keys = write_keys(tmp / "keys.toml", {TENANT: {"rate_per_minute": 100_000}})
        self.client: Client | None = None
        self.submitted: dict[str, float] = {}  # job key → unix time accepted
        self.keys_of: dict[str, str] = {}  # job id → key
        self.log, self.metrics_ports = list[str](), list[int]()
        self.kills: list[tuple[float, list[str]]] = []  # (unix time, jobs running there)

    def env(self) -> dict[str, str]:
        s3 = self.s3
        url = self.redis.url
        return {"FRAMEFLEET_BROKER_URL": url, "FRAMEFLEET_RESULT_BACKEND": url,
                "FRAMEFLEET_S3_ENDPOINT_URL": s3.endpoint_url, "FRAMEFLEET_S3_REGION": s3.region,
                "AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key,
                "FRAMEFLEET_OUTPUT_PREFIX": f"s3://{self.bucket}/out",
                "FRAMEFLEET_LEDGER_URI": f"s3://{self.bucket}/ledger",
                "FRAMEFLEET_RECONCILE_AFTER_S": "10"}

    def start(self) -> None:
        self.redis.start()
        self.s3.start()
        self.s3.client().create_bucket(Bucket=self.bucket)
        for shape in range(len(SHAPES)):
            buf = io.BytesIO()
            np.save(buf, latents(shape))
            self.s3.client().put_object(Bucket=self.bucket, Key=f"in/{TENANT}/shape-{shape}.npy",
                                        Body=buf.getvalue())
        ports = free_ports(3)
        for name, cpus, port in (("storm-a", 2, ports[0]), ("storm-b", 1, ports[2])):
            base = port - CPU_PORT_OFFSET
            self.metrics_ports += [base + CPU_PORT_OFFSET + j for j in range(cpus)]
            self.hosts.append(Host(name, self.tmp / "hosts", {
                **CHAOS_ENV, **self.env(), "FRAMEFLEET_METRICS_PORT": str(base)}, cpus=cpus))
        for host in self.hosts:
            host.start()
        # The gateway needs a model map; the storm's jobs are latents jobs, which use none.
        write_tiny(self.tmp / "tiny-wan", "t2v")
        models = write_models(self.tmp / "models.json", {"tiny": {
            "folder": str(self.tmp / "tiny-wan"), "size": "48x32", "seconds": "0.5",
            "steps": 2, "dtype": "float32"}})
        for i in range(2):
            gw = GatewayProcess(self.tmp, {**self.env(),
                                           "FRAMEFLEET_API_MODELS_FILE": str(models),
                                           "FRAMEFLEET_API_KEYS_FILE": str(self.tmp / "keys.toml"),
                                           "FRAMEFLEET_API_INPUT_PREFIX": f"s3://{self.bucket}/in"},
                                name=f"gateway-{i}")
            gw.start()
            self.gateways.append(gw)
        for host in self.hosts:
            host.wait_ready(120)
        self.client = Client(settings=Settings(broker_url=self.redis.url, max_time_limit_s=60,
                                               visibility_timeout_s=61))

    def stop(self) -> None:
        for proc in [*self.gateways, *self.hosts]:
            try:
                proc.stop()
            except Exception:  # noqa: BLE001 - clean up the rest
                pass
        self.s3.stop()
        self.redis.stop()

    # --- jobs ---------------------------------------------------------------------------------

    def spec_body(self, job: StormJob) -> dict[str, Any]:
        return {"job_id": job.job_id, "input": {"uri": f"s3://{self.bucket}/in/{TENANT}/"
                                                         f"shape-{job.shape}.npy"},
                "decoder": {"name": "pattern"}, "time_limit_s": 50,
                "video": {"segment_frames": SHAPES[job.shape][3]}}

    def submit(self, job: StormJob, deadline: float) -> None:
        """Submit until accepted (both routes are idempotent: the same spec again is the
        same job)."""
        body = self.spec_body(job)
        while True:
            try:
                if job.via == "gateway":
                    gw = self.gateways[hash(job.job_id) % len(self.gateways)]
                    status, answer = post_json(gw.url, "/v1/jobs", self.keys[TENANT], body)
                    if status != 200:
                        raise OSError(f"gateway {status}: {answer}")
                    # The gateway's job_id is the caller's id and a suffix of its own.
                    key = f"{TENANT}:{answer['job_id']}"
                else:
                    assert self.client is not None
                    spec = JobSpec.model_validate({**body, "output": {
                        "uri": f"s3://{self.bucket}/out"}})
                    key = self.client.submit(spec).key
                self.keys_of[job.job_id] = key
                self.submitted[key] = time.time()
                return
            except (OSError, BrokerError, ValueError) as e:
                if time.monotonic() > deadline:
                    raise AssertionError(f"{job.job_id} not accepted: {e}") from e
                time.sleep(0.3)

    def metas(self) -> dict[str, dict[str, Any]]:
        assert self.client is not None
        backend = self.client.app.backend
        keys = sorted(self.submitted)
        raw = backend.client.mget([backend.get_key_for_task(k) for k in keys])
        return {k: dict(backend.decode_result(v)) if v else {"status": "PENDING"}
                for k, v in zip(keys, raw, strict=True)}

    # --- faults -------------------------------------------------------------------------------

    def running_on(self, nodes: set[str]) -> list[str]:
        try:
            return [k for k, m in self.metas().items()
                    if m.get("status") in ("STARTED", "PROGRESS")
                    and (m.get("worker") or (m.get("result") or {}).get("hostname")) in nodes]
        except Exception:  # noqa: BLE001 - Redis may be away right now
            return []

    def apply(self, index: int, fault: Fault) -> None:
        t = time.time()
        if fault.kind == "kill-pool":
            host = self.hosts[fault.target % len(self.hosts)]
            try:  # launcher → Celery main processes → their pool processes
                pools = [c for m in psutil.Process(host.pid).children() for c in m.children()]
                victim = pools[fault.target % len(pools)]
            except (psutil.Error, ZeroDivisionError):
                self.log.append(f"kill-pool {host.host}: no pool process (host starting)")
                return
            running = self.running_on(set(host.nodenames))
            victim.send_signal(signal.SIGKILL)
            self.kills.append((t, running))
            self.log.append(f"kill-pool {host.host} pid {victim.pid}")
        elif fault.kind == "kill-host":
            host = self.hosts[fault.target % len(self.hosts)]
            running = self.running_on(set(host.nodenames))
            host.kill()
            self.kills.append((t, running))
            self.log.append(f"kill-host {host.host} ({len(running)} running)")
            time.sleep(3)
            host.start()
        elif fault.kind == "restart-redis":
            self.redis.kill()
            self.redis.start()
            self.log.append("restart-redis")
        elif fault.kind == "stop-s3":
            self.s3.restart()
            self.log.append("stop-s3 and start it again")
        elif fault.kind == "pause-s3":
            self.s3.pause()
            time.sleep(4)
            self.s3.resume()
            self.log.append("pause-s3 4 s")
        elif fault.kind == "restart-gateway":
            gw = self.gateways[fault.target % len(self.gateways)]
            gw.stop()
            gw.start()
            self.log.append(f"restart {gw.name}")
        elif fault.kind == "cancel":
            assert self.client is not None
            done = []
            for job_id in self.plan.cancels[index]:
                until = time.monotonic() + 10
                while (key := self.keys_of.get(job_id)) is None and time.monotonic() < until:
                    time.sleep(0.01)  # cancelled as soon as it is accepted
                if key is None:
                    continue
                try:
                    self.client.cancel(key)
                    done.append(job_id)
                except Exception:  # noqa: BLE001 - Redis away: a cancel that did not land
                    pass
            self.log.append(f"cancel {done}")


@pytest.fixture
def storm(tmp_path: Path) -> Iterator[Storm]:
    plan = Plan.draw(seed_from_env(), N_JOBS, FAULTS, WINDOW_S)
    print("\n" + plan.describe(), flush=True)
    s = Storm(tmp_path, plan)
    try:
        s.start()
        yield s
    finally:
        s.stop()


def test_storm(storm: Storm, tmp_path: Path) -> None:
    plan = storm.plan
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir()
    reference = reference_hashes(ref_dir)
    scraper = Scraper(storm.metrics_ports)
    scraper.start()
    # Given jobs going in through both routes from the start
    t0 = time.monotonic()
    errors: list[BaseException] = []

    def submit_all() -> None:
        try:
            for n, job in enumerate(plan.jobs):
                time.sleep(max(0.0, t0 + submit_at(n, len(plan.jobs), WINDOW_S)
                               - time.monotonic()))
                storm.submit(job, deadline=t0 + WINDOW_S + 120)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    submitter = threading.Thread(target=submit_all, daemon=True)
    submitter.start()
    # When the faults land at their times
    for index, fault in enumerate(plan.faults):
        time.sleep(max(0.0, t0 + fault.at_s - time.monotonic()))
        started = time.monotonic() - t0
        storm.apply(index, fault)
        storm.log[-1] = f"at {started:.1f} s: {storm.log[-1]}"
        print(f"t+{started:6.1f} s  {storm.log[-1]}", flush=True)
    faults_done = time.monotonic()
    submitter.join(timeout=WINDOW_S + 180)
    assert not errors, errors
    assert len(storm.submitted) == len(plan.jobs)
    # Then every job reaches a final state
    deadline = time.monotonic() + SETTLE_S
    while True:
        metas = storm.metas()
        open_jobs = [k for k, m in metas.items() if m.get("status") not in FINAL]
        if not open_jobs or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    settled = time.monotonic()
    scraper.stop()
    figures = check_outcome(storm, metas, reference, scraper)
    figures |= {"open": open_jobs, "storm_s": settled - t0, "faults_s": faults_done - t0}
    report(storm, figures)
    assert not open_jobs, f"jobs lost (not final {SETTLE_S:.0f} s after the faults): {open_jobs}"
    assert not figures["problems"], figures["problems"]


def check_outcome(storm: Storm, metas: dict[str, dict[str, Any]],
                  reference: dict[int, list[str]], scraper: Scraper) -> dict[str, Any]:
    """Every check of the end state; returns the figures, ``problems`` listing what failed."""
    problems: list[str] = []
    s3 = storm.s3.client()
    shape_of = {storm.keys_of[j.job_id]: j.shape for j in storm.plan.jobs}
    objects = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(
        Bucket=storm.bucket) for o in page.get("Contents", [])]
    statuses = {k: str(m.get("status")) for k, m in metas.items()}
    folders: dict[str, str] = {}  # out/<tenant>/<job_id>/ → key
    for key in metas:
        tenant, _, job_id = key.rpartition(":")
        folders[f"out/{tenant or 'default'}/{job_id}/"] = key
    # One output per success, its segments identical to the fault-free run of its shape.
    for key, meta in metas.items():
        if statuses[key] != "SUCCESS":
            continue
        manifest = (meta.get("result") or {}).get("manifest") or {}
        hashes = [seg["sha256"] for seg in manifest.get("segments", [])]
        if hashes != reference[shape_of[key]]:
            problems.append(f"{key}: segments {hashes} != fault-free {reference[shape_of[key]]}")
            continue
        for seg, want in zip(manifest["segments"], hashes, strict=True):
            obj = seg["uri"].split(f"s3://{storm.bucket}/", 1)[1]
            body = s3.get_object(Bucket=storm.bucket, Key=obj)["Body"].read()
            if hashlib.sha256(body).hexdigest() != want:
                problems.append(f"{key}: stored {obj} differs from its manifest")
    # Nothing outside the output prefix (and the ledger, and the inputs).
    inputs = {f"in/{TENANT}/shape-{i}.npy" for i in range(len(SHAPES))}
    for obj in objects:
        if obj in inputs or obj.startswith("ledger/"):
            continue
        folder = "/".join(obj.split("/")[:3]) + "/"
        if not obj.startswith("out/") or folder not in folders:
            problems.append(f"written outside the jobs' output folders: {obj}")
    # Every playlist of a final job ended.
    open_playlists = 0
    for obj in objects:
        if obj.endswith("/index.m3u8"):
            text = s3.get_object(Bucket=storm.bucket, Key=obj)["Body"].read().decode()
            if "#EXT-X-ENDLIST" not in text:
                open_playlists += 1
                problems.append(f"playlist left open: {obj} "
                                f"({statuses.get(folders.get(obj.rsplit('/', 1)[0] + '/', ''))})")
    # One ledger record per job, with its end.
    records = [LedgerRecord.model_validate_json(
        s3.get_object(Bucket=storm.bucket, Key=o)["Body"].read())
        for o in objects if o.startswith("ledger/")]
    problems += ledger_problems(records, statuses)
    # The workers' counts: never more ends than there were.
    counted = scraper.totals()
    ends = {v: sum(1 for s in statuses.values() if END.get(s) == v) for v in END.values()}
    for outcome, n in ends.items():
        if counted.get(outcome, 0.0) > n:
            problems.append(f"framefleet_jobs_total{{status={outcome}}} {counted[outcome]} > {n}")
    problems += [f"{k} failed: {str(metas[k].get('result') or {})[:200]}"
                 for k, s in statuses.items() if s == "FAILURE"][:5]
    # Redelivery: from a kill to the next receipt of each job that ran there.
    delays = [after[0] - killed for killed, running in storm.kills for key in running
              if (after := [t for t in received_at(storm.hosts, key)  # type: ignore[arg-type]
                            if t > killed])]
    return {"problems": problems, "ends": ends, "counted": counted, "records": len(records),
            "objects": len(objects), "open_playlists": open_playlists, "delays": delays,
            "resent": sum(h.log_text().count(" sent again by ") for h in storm.hosts),
            "requeued": sum(h.log_text().count(" requeued by ") for h in storm.hosts)}


def report(storm: Storm, f: dict[str, Any]) -> None:
    print(summary(storm.plan, f), flush=True)
    for problem in f["problems"]:
        print(f"storm problem: {problem}", flush=True)
    if FULL:
        RESULTS.write_text(results_md(storm.plan, storm.log, f))
