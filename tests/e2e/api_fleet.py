"""One small fleet for the API's end-to-end tests: a real Celery worker (the tiny Wan
pipeline for prompts, a paced pattern decoder for latents) and ``framefleet api`` as a real
uvicorn process, both on the session's Redis and SeaweedFS."""

from __future__ import annotations

import io
import json
import secrets
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from tests.gateway import GatewayProcess, Key, write_keys, write_models
from tests.services import S3Server, WorkerProcess
from worker.generate.model.tiny import write_tiny

#: Seconds per pattern chunk (4 frames): a 40-latent-frame job runs ~6 s.
CHUNK_S = 0.15
#: The fleet's webhook allow-list: one loopback entry that nothing listens on.
WEBHOOK_HOSTS = "https://127.0.0.1:9/none"
#: A generate step's pace: 400 steps of the tiny model last 20 s, many reads of the event stream.
STEP_S = 0.05


class PacedWorker(WorkerProcess):
    def argv(self) -> list[str]:
        argv = super().argv()
        argv[argv.index("-A") + 1] = "tests.e2e.paced_worker"
        return argv


@dataclass
class ApiFleet:
    gateway: GatewayProcess
    keys: dict[str, Key]
    bucket: str
    s3: S3Server
    worker: WorkerProcess

    @property
    def input_prefix(self) -> str:
        return f"s3://{self.bucket}/in"

    def put_latents(self, tenant: str, name: str, latent_frames: int, h: int = 8,
                    w: int = 12, fill: float = 0.0) -> str:
        """Latents of ``fill`` (the pattern decoder ignores values, but for
        ``paced_worker.FAULT_VALUE``) under the tenant's input prefix."""
        buf = io.BytesIO()
        np.save(buf, np.full((16, latent_frames, h, w), fill, np.float32))
        key = f"in/{tenant}/{name}.npy"
        self.s3.client().put_object(Bucket=self.bucket, Key=key, Body=buf.getvalue())
        return f"s3://{self.bucket}/{key}"

    def pattern_job(self, job_id: str, uri: str, **video: Any) -> dict[str, Any]:
        return {"job_id": job_id, "input": {"uri": uri}, "decoder": {"name": "pattern"},
                "video": {"segment_frames": 8, **video}}


@pytest.fixture(scope="module")
def api_fleet(tmp_path_factory: pytest.TempPathFactory, redis_url: str,
              s3: S3Server) -> Iterator[ApiFleet]:
    tmp = tmp_path_factory.mktemp("api")
    redis.Redis.from_url(redis_url).flushdb()
    # What framefleet models tiny writes: random weights, labelled so
    model = tmp / "tiny-wan"
    write_tiny(model, "t2v")
    bucket = f"ff-api-{secrets.token_hex(4)}"
    s3.client().create_bucket(Bucket=bucket)
    keys = write_keys(tmp / "keys.toml", {"acme": {"delete_outputs": True}, "evil": {},
                                          "slow": {"rate_per_minute": 3}})
    models = write_models(tmp / "models.json", {
        "tiny": {"folder": str(model), "size": "48x32", "seconds": "0.5", "steps": 2,
                 "dtype": "float32", "tier": "exact"},
        "tiny-slow": {"folder": str(model), "size": "48x32", "seconds": "0.5", "steps": 400,
                      "dtype": "float32", "limits": {"max_steps": 400}},
    })
    common = {"FRAMEFLEET_BROKER_URL": redis_url, "FRAMEFLEET_RESULT_BACKEND": redis_url,
              "FRAMEFLEET_S3_ENDPOINT_URL": s3.endpoint_url, "FRAMEFLEET_S3_REGION": s3.region,
              "AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key,
              "FRAMEFLEET_OUTPUT_PREFIX": f"s3://{bucket}/out",
              # An allow-list that no public host matches: a test (or a fuzzed body) that
              # names a webhook is refused at submit, so nothing beyond loopback is contacted.
              "FRAMEFLEET_WEBHOOK_HOSTS": WEBHOOK_HOSTS,
              # The fleet's step limit, which the gateway checks too (tiny-slow: 400 steps).
              "FRAMEFLEET_MAX_DENOISE_STEPS": "1000"}
    worker = PacedWorker("api-w1", tmp / "workers", {
        **common, "FRAMEFLEET_DEVICE": "cpu", "OMP_NUM_THREADS": "1",
        "FRAMEFLEET_METRICS_PORT": "0", "FRAMEFLEET_FILE_ROOTS": str(tmp),
        "FRAMEFLEET_WARMUP_MODEL": str(model),
        "FRAMEFLEET_TEST_CHUNK_S": str(CHUNK_S), "FRAMEFLEET_TEST_STEP_S": str(STEP_S)})
    gateway = GatewayProcess(tmp, {
        **common, "FRAMEFLEET_API_KEYS_FILE": str(tmp / "keys.toml"),
        "FRAMEFLEET_API_MODELS_FILE": str(models),
        "FRAMEFLEET_API_INPUT_PREFIX": f"s3://{bucket}/in",
        "FRAMEFLEET_API_EVENTS_POLL_S": "0.1"})  # the page's hls.js: the packaged one
    try:
        worker.start()
        gateway.start()
        worker.wait_ready(120)
        yield ApiFleet(gateway, keys, bucket, s3, worker)
    finally:
        gateway.stop()
        worker.stop()


@contextmanager
def replica(fleet: ApiFleet, workdir: Path, name: str, **env: str) -> Iterator[GatewayProcess]:
    """One more gateway process on the fleet's Redis and store, with ``env`` on top of the
    first one's settings (another replica, or one with other limits)."""
    gateway = GatewayProcess(workdir, {**fleet.gateway.env, **env}, name=name)
    try:
        gateway.start()
        yield gateway
    finally:
        gateway.stop()


def call(url: str, path: str, key: Key | None = None, method: str = "GET",
         headers: dict[str, str] | None = None,
         body: bytes | None = None) -> tuple[int, Any, bytes]:
    """One request: (status, headers (case-insensitive), body)."""
    h = {**(key.headers if key else {}), **(headers or {})}
    req = urllib.request.Request(url + path, data=body, headers=h, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return int(r.status), r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def post_json(url: str, path: str, key: Key, data: Any) -> tuple[int, Any]:
    """POST ``data`` as JSON: (status, the JSON answer)."""
    status, _, body = call(url, path, key, "POST", {"Content-Type": "application/json"},
                           json.dumps(data).encode())
    return status, json.loads(body)


def wait_for(probe: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while (value := probe()) is None:
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.1)
    return value


__all__ = ["ApiFleet", "Path", "api_fleet", "call", "post_json", "replica", "wait_for"]
