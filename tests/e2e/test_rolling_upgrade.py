"""A fleet upgraded while it runs: half the workers and a gateway run the release before this
one (its code checked out beside this one, from git), half this one; jobs flow the whole time,
submitted through both releases' clients and gateways, and the old worker is replaced by a new
one mid-stream (a warm shutdown: its job finishes). Every job succeeds, and each release's
client and gateway reads every job's state and result, whichever release ran it: no reader
meets a field or a stage name it cannot read.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from producer.client import Client
from producer.wire.spec import JobResult
from tests.e2e.api_fleet import call
from tests.e2e.helpers import pattern_spec, put_latents
from tests.gateway import GatewayProcess, write_keys, write_models
from tests.require import on_ci
from tests.services import REPO_ROOT, S3Server, WorkerProcess

pytestmark = pytest.mark.e2e

#: The release before this one: main as it landed at the end of the previous round.
PREVIOUS_RELEASE = "4a76735"
JOB = {"latent_frames": 6, "h": 32, "w": 40}


def _previous(tmp: Path) -> Path:
    """The previous release's tree, from this checkout's git history."""
    done = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", PREVIOUS_RELEASE],
                          capture_output=True, timeout=120)
    if done.returncode != 0:
        why = (f"the previous release ({PREVIOUS_RELEASE}) is not in this checkout's git "
               f"history: {done.stderr.decode().strip()} (a full clone has it)")
        if on_ci():
            pytest.fail(why)
        pytest.skip(why)
    root = tmp / "previous"
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
        tar.extractall(root, filter="data")
    return root


class OldWorker(WorkerProcess):
    """A worker of the previous release: its code first on the path, run from its tree."""

    def __init__(self, tree: Path, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tree = tree

    def start(self) -> None:
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(self.tree)}
        self._spawn(self.argv(), env, self.tree)


def _old_client(tree: Path, env: dict[str, str], script: str, *args: str) -> Any:
    """Run ``script`` (Python, ``args`` in ``sys.argv``) with the previous release's producer
    package; its last line of output, as JSON."""
    done = subprocess.run([sys.executable, "-c", script, *args], cwd=tree, capture_output=True,
                          text=True, timeout=180,
                          env={**os.environ, **env, "PYTHONPATH": str(tree)})
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


OLD_SUBMIT = """
import json, sys
from producer.client import Client
from producer.wire.spec import JobSpec
spec = JobSpec.model_validate_json(sys.argv[1])
print(json.dumps({"key": Client().submit(spec).job_id}))
"""
OLD_READ = """
import json, sys
from producer.client import Client
client = Client()
out = {}
for job in sys.argv[1:]:
    handle = client.get(job)
    result = handle.wait(timeout=120)
    out[job] = {"status": handle.status(), "frames": result.manifest.frames,
                "node": result.worker.node, "stages": [s.stage for s in result.cost.stages]}
print(json.dumps(out))
"""


@pytest.fixture
def fleet(tmp_path: Path, redis_url: str, s3: S3Server, s3_bucket: str
          ) -> Iterator[dict[str, Any]]:
    redis.Redis.from_url(redis_url).flushdb()
    tree = _previous(tmp_path)
    env = {"FRAMEFLEET_BROKER_URL": redis_url, "FRAMEFLEET_RESULT_BACKEND": redis_url,
           "FRAMEFLEET_S3_ENDPOINT_URL": s3.endpoint_url, "FRAMEFLEET_S3_REGION": s3.region,
           "AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key,
           "FRAMEFLEET_DEVICE": "cpu", "FRAMEFLEET_METRICS_PORT": "0", "OMP_NUM_THREADS": "1"}
    keys = write_keys(tmp_path / "keys.toml", {"acme": {}})
    models = write_models(tmp_path / "models.json", {  # the map needs one; no job here uses it
        "unused": {"folder": str(tmp_path / "no-model"), "size": "48x32", "seconds": "0.5"}})
    api = {**env, "FRAMEFLEET_API_KEYS_FILE": str(tmp_path / "keys.toml"),
           "FRAMEFLEET_API_MODELS_FILE": str(models),
           "FRAMEFLEET_API_INPUT_PREFIX": f"s3://{s3_bucket}/in",
           "FRAMEFLEET_OUTPUT_PREFIX": f"s3://{s3_bucket}/out"}
    procs: list[Any] = [
        OldWorker(tree, "old", tmp_path / "workers", env),
        WorkerProcess("new", tmp_path / "workers", env),
        GatewayProcess(tmp_path, {**api, "PYTHONPATH": str(tree)}, name="old-api", cwd=tree),
        GatewayProcess(tmp_path, api, name="new-api"),
    ]
    try:
        for p in procs:
            p.start()
        for p in procs[:2]:
            p.wait_ready(120)
        yield {"tree": tree, "env": env, "procs": procs, "keys": keys, "bucket": s3_bucket,
               "tmp": tmp_path}
    finally:
        for p in procs:
            p.stop()


@pytest.mark.timeout(600)
def test_a_fleet_of_two_releases_runs_every_job_and_both_read_every_result(
        fleet: dict[str, Any], redis_url: str, s3: S3Server) -> None:
    tree, env, bucket = fleet["tree"], fleet["env"], fleet["bucket"]
    old_worker, _, old_api, new_api = fleet["procs"]
    client = Client(broker_url=redis_url, backend_url=redis_url)
    uri = put_latents(s3, bucket, "in/acme/clip.safetensors", **JOB)
    jobs: list[str] = []
    public: list[str] = []  # the gateways' ids of their jobs

    def wave(tag: str) -> None:
        # Each release's client submits, and each release's gateway
        for i in range(2):
            spec = pattern_spec(f"{tag}-new-{i}", uri, bucket, segment_frames=12)
            jobs.append(client.submit(spec).job_id)
        spec = pattern_spec(f"{tag}-old-client", uri, bucket, segment_frames=12)
        jobs.append(_old_client(tree, env, OLD_SUBMIT, spec.model_dump_json())["key"])
        for api in (old_api, new_api):
            body = json.dumps({"job_id": f"{tag}-{api.name}", "input": {"uri": uri},
                               "decoder": {"name": "pattern"}}).encode()
            status, _, answer = call(api.url, "/v1/jobs", fleet["keys"]["acme"], "POST",
                                     {"Content-Type": "application/json"}, body)
            assert status in (200, 201, 202), (api.name, status, answer)
            job = json.loads(answer)
            public.append(job["id"])
            jobs.append(job["job_id"] if ":" in job["job_id"] else f"acme:{job['job_id']}")

    # Given jobs flowing through a fleet of both releases
    wave("before")
    # When the old worker is replaced by a new one mid-stream (its running job finishes)
    time.sleep(1.0)
    old_worker.stop()
    replacement = WorkerProcess("new2", fleet["tmp"] / "workers", env)
    fleet["procs"].append(replacement)
    replacement.start()
    replacement.wait_ready(120)
    wave("after")
    # Then every job succeeds, read by this release's client ...
    results: dict[str, JobResult] = {}
    for job in jobs:
        handle = client.get(job)
        results[job] = handle.wait(timeout=180)
        assert handle.status() == "SUCCESS", job
    # ... and by the previous release's, whichever release ran it
    seen = _old_client(tree, env, OLD_READ, *jobs)
    for job, result in results.items():
        assert seen[job]["status"] == "SUCCESS" and seen[job]["frames"] == result.manifest.frames
    # Both releases' workers ran jobs, and both gateways answer for every job
    nodes = {r.worker.node.split("@")[0] for r in results.values()}
    assert "old" in nodes and nodes & {"new", "new2"}, nodes
    for api in (old_api, new_api):
        for job in public:
            status, _, answer = call(api.url, f"/v1/jobs/{job}", fleet["keys"]["acme"])
            assert status == 200 and json.loads(answer)["state"] == "SUCCESS", (api.name, answer)
    assert np.isfinite(sum(r.timings.wall_s for r in results.values()))
