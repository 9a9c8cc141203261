"""The storm's fleet, in a network-namespace lab (``tests/e2e/netns.py``): Redis (append-only,
every write fsynced), SeaweedFS and two gateway replicas (``framefleet api``) in the services'
namespace; two worker hosts (``tests/e2e/hosts.py``), each in a namespace of its own so that
it can lose a network path while every process of it lives: ``a`` runs two CPU workers, ``b``
one.

Everything that talks to the services runs on a thread of the services' namespace (the
caller's: ``start``, ``submit``, ``metas``); a host is started on its own namespace's thread.
"""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import numpy as np

from producer.client import Client
from producer.errors import BrokerError
from producer.ports import CPU_PORT_OFFSET
from producer.settings import Settings
from producer.wire.spec import JobSpec
from tests.e2e.api_fleet import post_json
from tests.e2e.chaos_helpers import CHAOS_ENV
from tests.e2e.hosts import Host
from tests.e2e.netns import Lab
from tests.e2e.partition_fleet import LabRedis, LabS3
from tests.e2e.storm import SHAPES, Plan, StormJob, latents
from tests.gateway import GatewayProcess, write_keys, write_models
from tests.require import require_binary
from tests.services import REDIS_INSTALL, WEED_INSTALL
from worker.generate.model.tiny import write_tiny

TENANT = "acme"
#: The worker hosts: lab name and CPU workers.
HOSTS = (("a", 2), ("b", 1))
#: The workers' metrics ports: ``base + CPU_PORT_OFFSET + j`` on each host's own address (a
#: namespace of its own: any port is free there).
METRICS_BASE = 9000


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


class StormFleet:
    """The fleet and the jobs of one storm."""

    def __init__(self, tmp: Path, lab: Lab, plan: Plan) -> None:
        self.tmp, self.lab, self.plan = tmp, lab, plan
        self.redis = LabRedis(require_binary("redis-server", REDIS_INSTALL), tmp / "redis",
                              appendonly=True)
        self.s3 = LabS3(require_binary("weed", WEED_INSTALL), tmp / "s3")
        self.bucket, self.hosts, self.gateways = "storm", list[Host](), list[GatewayProcess]()
        self.namespaces = list[str]()  # the lab's name of each host's namespace
        self.keys = write_keys(tmp / "keys.toml", {TENANT: {"rate_per_minute": 100_000}})
        self.client: Client | None = None
        self.submitted: dict[str, float] = {}  # job key → unix time accepted
        self.keys_of: dict[str, str] = {}  # job id → key
        self.metrics_urls = list[str]()

    @property
    def redis_port(self) -> int:
        return _port(self.redis.url)

    @property
    def s3_port(self) -> int:
        return _port(self.s3.endpoint_url)

    def env(self) -> dict[str, str]:
        s3, url = self.s3, self.redis.url
        return {"FRAMEFLEET_BROKER_URL": url, "FRAMEFLEET_RESULT_BACKEND": url,
                "FRAMEFLEET_S3_ENDPOINT_URL": s3.endpoint_url, "FRAMEFLEET_S3_REGION": s3.region,
                "AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key,
                "FRAMEFLEET_OUTPUT_PREFIX": f"s3://{self.bucket}/out",
                "FRAMEFLEET_LEDGER_URI": f"s3://{self.bucket}/ledger",
                "FRAMEFLEET_RECONCILE_AFTER_S": "10"}

    def start(self) -> None:
        """Services, gateways and hosts, all ready (call it on the services' thread)."""
        self.redis.start()
        self.s3.start()
        self.s3.client().create_bucket(Bucket=self.bucket)
        for shape in range(len(SHAPES)):
            buf = io.BytesIO()
            np.save(buf, latents(shape))
            self.s3.client().put_object(Bucket=self.bucket, Key=f"in/{TENANT}/shape-{shape}.npy",
                                        Body=buf.getvalue())
        for name, cpus in HOSTS:
            ns = self.lab.hosts[name]
            self.metrics_urls += [f"http://{ns.address}:{METRICS_BASE + CPU_PORT_OFFSET + j}"
                                  for j in range(cpus)]
            host = Host(f"storm-{name}", self.tmp / "hosts", {
                **CHAOS_ENV, **self.env(), "FRAMEFLEET_METRICS_PORT": str(METRICS_BASE),
                "FRAMEFLEET_METRICS_ADDR": ns.address}, cpus=cpus)
            self.hosts.append(host)
            self.namespaces.append(name)
            ns.run(host.start)
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
            host.wait_ready(180)
        self.client = Client(settings=Settings(broker_url=self.redis.url, max_time_limit_s=60,
                                               visibility_timeout_s=61))

    def start_host(self, index: int) -> None:
        """Start host ``index`` again, in its namespace."""
        host = self.hosts[index]
        self.lab.hosts[self.namespaces[index]].run(host.start)

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

    def metas_of(self, keys: list[str]) -> list[dict[str, Any]]:
        """The states of ``keys`` now ({} each while Redis is away)."""
        assert self.client is not None
        backend = self.client.app.backend
        try:
            raw = backend.client.mget([backend.get_key_for_task(k) for k in keys]) if keys else []
        except Exception:  # noqa: BLE001 - Redis may be away right now
            return [{} for _ in keys]
        return [dict(backend.decode_result(v)) if v else {} for v in raw]

    def running_on(self, nodes: set[str]) -> list[str]:
        """The jobs running on ``nodes`` now, as their states say ([] while Redis is away)."""
        try:
            return [k for k, m in self.metas().items()
                    if m.get("status") in ("STARTED", "PROGRESS")
                    and (m.get("worker") or (m.get("result") or {}).get("hostname")) in nodes]
        except Exception:  # noqa: BLE001 - Redis may be away right now
            return []
