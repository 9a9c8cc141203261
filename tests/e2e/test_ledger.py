"""The durable job and cost ledger on S3: every end recorded once, partitioned by day and
tenant, linked from the job's folder, read by ``framefleet jobs`` and ``framefleet cost
report``, and unchanged when Redis loses its data. Real Redis, SeaweedFS and a worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
import redis

from producer.client import Client
from producer.errors import JobCancelled, JobFailed
from tests.e2e.chaos_helpers import wait_for
from tests.e2e.helpers import pattern_spec, put_latents
from tests.services import REPO_ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_the_ledger_keeps_the_history_when_redis_loses_it(
    redis_url: str, worker_factory: Any, worker_env: dict[str, str], s3: Any, s3_bucket: str
) -> None:
    r = redis.Redis.from_url(redis_url)
    r.flushdb()
    ledger = f"s3://{s3_bucket}/ledger"
    worker_factory(1, env={"FRAMEFLEET_LEDGER_URI": ledger, "FRAMEFLEET_DEVICE": "cpu",
                           "OMP_NUM_THREADS": "1"})
    client = Client(broker_url=redis_url, backend_url=redis_url)
    # Given jobs of two tenants that succeed, one that fails and one cancelled mid-way
    small = put_latents(s3, s3_bucket, "in/small.npy", latent_frames=3, fmt="npy")
    long = put_latents(s3, s3_bucket, "in/long.npy", latent_frames=120, h=48, w=64, fmt="npy")
    for job_id, tenant in (("ok-1", "acme"), ("ok-2", "acme"), ("ok-3", "beta")):
        client.submit(pattern_spec(job_id, small, s3_bucket, tenant=tenant)).wait(timeout=60)
    with pytest.raises(JobFailed):
        client.submit(pattern_spec("bad-1", f"s3://{s3_bucket}/in/none.npy", s3_bucket,
                                   tenant="beta")).wait(timeout=60)
    cancelled = client.submit(pattern_spec("stop-1", long, s3_bucket, tenant="acme",
                                           segment_frames=24))
    wait_for(lambda: cancelled.state().state == "PROGRESS" or None, 60, "stop-1 mid-way")
    client.cancel("acme:stop-1")
    with pytest.raises(JobCancelled):
        cancelled.wait(timeout=60)

    env = {k: v for k, v in worker_env.items() if k != "FRAMEFLEET_METRICS_PORT"}
    env["FRAMEFLEET_LEDGER_URI"] = ledger

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("FRAMEFLEET_")}
        return subprocess.run([sys.executable, "-m", "producer.cli", *args], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=120,
                              env={**base, **env, "PYTHONPATH": str(REPO_ROOT),
                                   "COLUMNS": "200"})

    # Then the ledger holds one record per end, in day and tenant partitions
    keys = [o["Key"] for o in s3.client().list_objects_v2(
        Bucket=s3_bucket, Prefix="ledger/")["Contents"]]
    assert len(keys) == 5, keys
    assert {k.split("/")[2] for k in keys} == {"tenant=acme", "tenant=beta"}
    assert all(k.split("/")[1].startswith("day=") for k in keys)
    # the job's folder names its record
    link = json.loads(s3.client().get_object(Bucket=s3_bucket, Key="out/acme/ok-1/ledger.json")
                      ["Body"].read())
    assert link["key"] == "acme:ok-1" and link["records"][0]["status"] == "success"
    assert link["records"][0]["uri"].removeprefix(f"s3://{s3_bucket}/") in keys
    # framefleet jobs lists them, filtered by state and tenant, and shows one
    listed = cli("jobs", "list", "--since", "all", "--json")
    assert listed.returncode == 0, listed.stderr
    statuses = sorted((json.loads(line)["key"], json.loads(line)["status"])
                      for line in listed.stdout.splitlines())
    assert statuses == [("acme:ok-1", "success"), ("acme:ok-2", "success"),
                        ("acme:stop-1", "cancelled"), ("beta:bad-1", "failure"),
                        ("beta:ok-3", "success")]
    failed = cli("jobs", "list", "--state", "failure", "--tenant", "beta")
    assert "beta:bad-1" in failed.stdout and "InputNotFoundError" in failed.stdout
    assert "1 job(s)" in failed.stdout and "ok-3" not in failed.stdout
    shown = cli("jobs", "show", "acme:ok-1")
    assert shown.returncode == 0, shown.stderr
    assert f"manifest: s3://{s3_bucket}/out/acme/ok-1/manifest.json" in shown.stdout
    assert "states: QUEUED " in shown.stdout and "SUCCESS " in shown.stdout
    # framefleet cost report reads the ledger, per tenant and per job
    before = json.loads(cli("cost", "report", "--since", "all", "--json").stdout)
    assert before["source"] == f"ledger {ledger}"
    assert (before["jobs"], before["held_runs"]) == (3, 2)
    by_job = cli("cost", "report", "--since", "all", "--by", "job")
    assert by_job.returncode == 0, by_job.stderr
    for key in ("acme:ok-1", "acme:ok-2", "beta:ok-3", "acme:stop-1", "beta:bad-1"):
        assert key in by_job.stdout
    # When Redis loses everything
    r.flushall()
    assert client.state("acme:ok-1").state == "UNKNOWN"
    # Then the report and the jobs are unchanged
    after = json.loads(cli("cost", "report", "--since", "all", "--json").stdout)
    assert after == before
    assert cli("jobs", "list", "--since", "all", "--json").stdout == listed.stdout
