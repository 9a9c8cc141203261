"""A fleet in network namespaces (``tests/e2e/netns.py``) for the partition tests: Redis,
SeaweedFS and a webhook receiver in the services' namespace, two worker hosts (``a``, ``b``)
each in its own, and the steps that talk to the services run there (``Stage.call``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from producer.client import Client
from producer.settings import get_settings
from tests.e2e.chaos_helpers import Jobs
from tests.e2e.hosts import Host
from tests.e2e.netns import SERVICES, Lab
from tests.e2e.test_host_loss import RECOVERY_ENV
from tests.e2e.webhook_fleet import SECRET
from tests.e2e.zombies import Stage
from tests.gateway import GatewayProcess, write_keys, write_models
from tests.receiver import Receiver
from tests.require import require_binary
from tests.services import REDIS_INSTALL, WEED_INSTALL, RedisServer, S3Server


class LabRedis(RedisServer):
    """Redis on the services' bridge address (and their loopback, for its own PING)."""

    @property
    def url(self) -> str:
        return f"redis://{SERVICES}:{self.port}/0"

    def argv(self) -> list[str]:
        argv = super().argv()
        argv[argv.index("--bind") + 1:argv.index("--bind") + 2] = [SERVICES, "127.0.0.1"]
        # No password, and reached from other namespaces' addresses: only the lab's hosts can.
        return [*argv, "--protected-mode", "no"]


class LabS3(S3Server):
    """SeaweedFS on every address of the services' namespace, reached on the bridge's."""

    @property
    def endpoint_url(self) -> str:
        return f"http://{SERVICES}:{self.ports['s3.port']}"

    def argv(self) -> list[str]:
        return [{"-ip=127.0.0.1": f"-ip={SERVICES}", "-ip.bind=127.0.0.1": "-ip.bind=0.0.0.0"}
                .get(a, a) for a in super().argv()]


@contextmanager
def partition_stage(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Lab, Stage]]:
    """The lab, its services and two ready hosts; the stage of their jobs."""
    redis_bin = require_binary("redis-server", REDIS_INSTALL)
    weed_bin = require_binary("weed", WEED_INSTALL)
    with Lab(("a", "b")) as lab:
        svc = lab.services
        redis_server = LabRedis(redis_bin, tmp / "redis")
        s3 = LabS3(weed_bin, tmp / "s3")
        hosts: list[Host] = []
        receiver = svc.run(lambda: Receiver(host=SERVICES))
        try:
            svc.run(redis_server.start)
            svc.run(s3.start)
            bucket = "partitions"
            svc.run(lambda: s3.client().create_bucket(Bucket=bucket))
            receiver.__enter__()
            env = {**_env(redis_server.url, s3, bucket, receiver.port),
                   # a generate job's model folder, and its steps: a denoise of tens of seconds
                   "FRAMEFLEET_FILE_ROOTS": str(tmp), "FRAMEFLEET_MAX_DENOISE_STEPS": "1000"}
            for key in ("FRAMEFLEET_WEBHOOK_SECRET", "FRAMEFLEET_WEBHOOK_SCHEMES",
                        "FRAMEFLEET_WEBHOOK_HOSTS", "FRAMEFLEET_FILE_ROOTS",
                        "FRAMEFLEET_MAX_DENOISE_STEPS"):
                monkeypatch.setenv(key, env[key])  # the client checks the webhook at submit
            get_settings.cache_clear()
            for name, ns in lab.hosts.items():
                host = Host(f"part{name}", tmp / "hosts", env)
                hosts.append(host)
                ns.run(host.start)
            for host in hosts:
                host.wait_ready(180)
            client = svc.run(lambda: Client(broker_url=redis_server.url,
                                            backend_url=redis_server.url))
            stage = Stage(hosts, Jobs(client, s3, bucket), receiver, redis_server.url, tmp,
                          call=svc.run)
            yield lab, stage
        finally:
            for host in hosts:
                host.terminate()
            for host in hosts:
                host.stop(timeout=20)
            receiver.__exit__()
            s3.stop()
            redis_server.stop()
            get_settings.cache_clear()


def _env(redis_url: str, s3: S3Server, bucket: str, receiver_port: int) -> dict[str, Any]:
    import os

    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("FRAMEFLEET_")},
        **RECOVERY_ENV,
        "FRAMEFLEET_BROKER_URL": redis_url, "FRAMEFLEET_RESULT_BACKEND": redis_url,
        "FRAMEFLEET_S3_ENDPOINT_URL": s3.endpoint_url, "FRAMEFLEET_S3_REGION": s3.region,
        "AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key,
        "FRAMEFLEET_LEDGER_URI": f"s3://{bucket}/ledger",
        "FRAMEFLEET_WEBHOOK_SECRET": SECRET, "FRAMEFLEET_WEBHOOK_SCHEMES": "http",
        "FRAMEFLEET_WEBHOOK_HOSTS": f"http://{SERVICES}:{receiver_port}/hook",
        "FRAMEFLEET_WEBHOOK_BACKOFF_S": "0.5",
    }


class LabGateway(GatewayProcess):
    """``framefleet api`` on its namespace's address (``address``)."""

    def __init__(self, address: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.address = address
        self.env["FRAMEFLEET_API_ADDR"] = address

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"


@contextmanager
def edge_stage(tmp: Path) -> Iterator[dict[str, Any]]:
    """A lab with a worker host ``a``, a gateway in ``gw`` and a client's namespace ``cli``:
    Redis and SeaweedFS in the services' namespace; the gateway's key and the bucket."""
    redis_bin = require_binary("redis-server", REDIS_INSTALL)
    weed_bin = require_binary("weed", WEED_INSTALL)
    with Lab(("a", "gw", "cli")) as lab:
        svc = lab.services
        redis_server, s3 = LabRedis(redis_bin, tmp / "redis"), LabS3(weed_bin, tmp / "s3")
        procs: list[Any] = []
        try:
            svc.run(redis_server.start)
            svc.run(s3.start)
            bucket = "edge"
            svc.run(lambda: s3.client().create_bucket(Bucket=bucket))
            env = _env(redis_server.url, s3, bucket, 9)
            keys = write_keys(tmp / "keys.toml", {"acme": {}})
            models = write_models(tmp / "models.json", {"unused": {
                "folder": str(tmp / "none"), "size": "48x32", "seconds": "0.5"}})
            host = Host("edgea", tmp / "hosts", env)
            gateway = LabGateway(lab.hosts["gw"].address, tmp, {
                **env, "FRAMEFLEET_API_KEYS_FILE": str(tmp / "keys.toml"),
                "FRAMEFLEET_API_MODELS_FILE": str(models),
                "FRAMEFLEET_API_INPUT_PREFIX": f"s3://{bucket}/in",
                "FRAMEFLEET_OUTPUT_PREFIX": f"s3://{bucket}/out"})
            procs += [host, gateway]
            lab.hosts["a"].run(host.start)
            lab.hosts["gw"].run(gateway.start)
            host.wait_ready(180)
            yield {"lab": lab, "redis": redis_server, "s3": s3, "bucket": bucket,
                   "gateway": gateway, "key": keys["acme"], "host": host}
        finally:
            for p in procs:
                p.stop()
            s3.stop()
            redis_server.stop()
