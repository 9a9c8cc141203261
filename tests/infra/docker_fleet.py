"""The compose fleet of the docker test: the docs' blocks, a scratch copy to run them in, and
what the test reads back (containers' logs, S3 objects, Prometheus and Flower over loopback).

The docker compose section of docs/deploy.md is the script: its bash blocks are taken from it
by what they do (``--profile cpu up -d``, ``framefleet submit``, ``--profile cpu down``) and run
as written, so the two cannot drift apart. They run in a scratch copy of the files the build and
compose need, never in the checkout: the first block writes ``docker/.env``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import boto3
from botocore.config import Config

from producer.client import Client
from producer.wire.spec import JobResult, Manifest, segment_name
from worker.pipeline.encode import read_frames_rgb

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]
#: The page and section whose bash blocks are the script (they were the README's).
PAGE = REPO / "docs" / "deploy.md"
SECTION = "## With docker compose (one host)"
#: What the build contexts and compose.yaml read: the code, the docker and Prometheus files.
COPIED = ("pyproject.toml", "README.md", ".dockerignore", "producer", "worker", "docker",
          "infra/prometheus", "infra/grafana", "wheels", "scripts/docker-standins.sh")
# `docker compose` where the client has the plugin, Debian's docker-compose (v1) elsewhere:
# the README's commands are the same for both.
COMPOSE_SHIM = """\
if ! docker compose version >/dev/null 2>&1; then
  docker() {
    if [ "$1" = compose ]; then shift; command docker-compose "$@"; else command docker "$@"; fi
  }
fi
set -euo pipefail
"""
TASK = "framefleet.decode_video"


def readme_block(containing: str) -> str:
    """The one bash block of the docker compose section (docs/deploy.md) that contains
    ``containing``."""
    text = PAGE.read_text()
    start = text.index(f"\n{SECTION}\n")
    end = text.find("\n## ", start + 1)
    blocks = re.findall(r"```bash\n(.*?)```", text[start:end if end > 0 else None], re.S)
    found = [b for b in blocks if containing in b]
    assert len(found) == 1, f"{len(found)} bash blocks with {containing!r} in {PAGE.name} {SECTION}"
    return found[0]


def scratch_copy(dest: Path) -> Path:
    """The files of ``COPIED`` under ``dest`` (large wheels hard-linked), without docker/.env."""
    def link_or_copy(src: str, dst: str) -> None:
        try:
            Path(dst).hardlink_to(src)
        except OSError:
            shutil.copy2(src, dst)

    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".env")
    for name in COPIED:
        src, dst = REPO / name, dest / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=ignore, copy_function=link_or_copy)
        else:
            shutil.copy2(src, dst)
    return dest


@dataclass
class Fleet:
    """The compose project of the test, run from the scratch copy ``root``."""

    root: Path
    docker: str
    env: dict[str, str]
    log_dir: Path
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def project(self) -> str:
        return self.env["COMPOSE_PROJECT_NAME"]

    def bash(self, script: str, name: str, timeout: float,
             extra_env: Mapping[str, str] | None = None) -> str:
        """Run ``script`` (after the compose shim) in ``root``; its output goes to
        ``log_dir/name.log`` and is returned. A failure shows the log's tail."""
        log = self.log_dir / f"{name}.log"
        with log.open("w") as out:
            done = subprocess.run(["bash", "-c", COMPOSE_SHIM + script], cwd=self.root,
                                  env={**self.env, **(extra_env or {})}, stdout=out,
                                  stderr=subprocess.STDOUT, timeout=timeout, check=False)
        text = log.read_text(errors="replace")
        assert done.returncode == 0, f"{name} exited {done.returncode}:\n{text[-4000:]}"
        return text

    def dotenv(self) -> dict[str, str]:
        """docker/.env as the README's first block wrote it."""
        lines = (self.root / "docker/.env").read_text().splitlines()
        return dict(line.split("=", 1) for line in lines if "=" in line)

    def client(self) -> Client:
        url = f"redis://:{self.dotenv()['REDIS_PASSWORD']}@127.0.0.1:{self.env['REDIS_HOST_PORT']}"
        return Client(broker_url=f"{url}/0", backend_url=f"{url}/1")

    def s3(self) -> Any:
        """boto3 against the compose S3's published port (typed Any: no stubs for it here)."""
        env = self.dotenv()
        return boto3.client(
            "s3", endpoint_url=f"http://127.0.0.1:{self.env['S3_HOST_PORT']}",
            aws_access_key_id=env["S3_ACCESS_KEY"], aws_secret_access_key=env["S3_SECRET_KEY"],
            region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3}))

    def get_json(self, port_var: str, path: str, user: str | None = None) -> Any:
        """GET ``http://127.0.0.1:<port>/<path>`` as JSON; ``user`` logs in with Flower's
        password. None when the server does not answer (yet)."""
        request = urllib.request.Request(f"http://127.0.0.1:{self.env[port_var]}{path}")
        if user is not None:
            token = f"{user}:{self.dotenv()['FLOWER_PASSWORD']}".encode()
            request.add_header("Authorization", "Basic " + base64.b64encode(token).decode())
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return json.loads(response.read())
        except (OSError, ValueError):
            return None

    def docker_run(self, *args: str, timeout: float = 120) -> str:
        done = subprocess.run([self.docker, *args], capture_output=True, text=True,
                              timeout=timeout, check=False)
        assert done.returncode == 0, f"docker {' '.join(args)}: {done.stderr[-2000:]}"
        return done.stdout

    def containers(self, service: str | None = None) -> list[str]:
        """Ids of the project's containers (of one service), running or not."""
        filters = ["--filter", f"label=com.docker.compose.project={self.project}"]
        if service:
            filters += ["--filter", f"label=com.docker.compose.service={service}"]
        return self.docker_run("ps", "-aq", *filters).split()

    def container(self, service: str) -> str:
        (cid,) = self.containers(service)
        return cid

    def remove_leftovers(self) -> None:
        """Remove containers and volumes of this test's compose project (its own name)."""
        if self.containers():
            self.docker_run("rm", "--force", "--volumes", *self.containers())
        if self.volumes():
            self.docker_run("volume", "rm", *self.volumes())

    def volumes(self) -> list[str]:
        label = f"label=com.docker.compose.project={self.project}"
        return self.docker_run("volume", "ls", "-q", "--filter", label).split()

    def logs(self, service: str) -> list[tuple[datetime, str]]:
        """The service's log lines with docker's receive time (UTC, the host's clock)."""
        # Celery logs to stderr, which `docker logs` gives back on its own stderr.
        done = subprocess.run([self.docker, "logs", "--timestamps", self.container(service)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=60, check=True)
        out = done.stdout
        lines = []
        # "\n" only: a progress bar's "\r" is inside one line of the log.
        for line in out.split("\n"):
            stamp, _, text = line.partition(" ")
            # RFC 3339 with nanoseconds: Python takes microseconds.
            match = re.fullmatch(r"(\S+T[\d:]+)(\.\d{1,6})?\d*Z", stamp)
            if match:
                when = datetime.fromisoformat(match[1] + (match[2] or "") + "+00:00")
                lines.append((when, text))
        return lines

    def task_lines(self, service: str, key: str, what: str) -> list[datetime]:
        """When ``service`` logged Celery's ``Task ...[key] <what>`` lines (the job's key,
        ``tenant:job_id``, is its task id)."""
        needle = f"Task {TASK}[{key}] {what}"
        return [t for t, line in self.logs(service) if needle in line]


def read_back(s3: Any, result: JobResult, tmp: Path) -> list[list[Any]]:
    """Every segment of a finished job from S3: bytes and sha256 as the manifest says, the
    listing exactly segments + playlist + manifest; returns each segment's decoded frames."""
    bucket, _, key = result.manifest_uri.removeprefix("s3://").partition("/")
    prefix = key.removesuffix("manifest.json")
    manifest = Manifest.model_validate_json(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    assert manifest.segments == result.manifest.segments
    listed = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]}
    expected = {prefix + segment_name(s.index) for s in manifest.segments}
    # (a generate job also leaves its previews, on by default, under previews/)
    videos = {k for k in listed if not k.startswith(prefix + "previews/")}
    assert videos == expected | {key, prefix + "index.m3u8"}, listed
    frames = []
    for seg in manifest.segments:
        data = s3.get_object(Bucket=bucket, Key=prefix + segment_name(seg.index))["Body"].read()
        assert len(data) == seg.bytes and hashlib.sha256(data).hexdigest() == seg.sha256
        path = tmp / f"{manifest.job_id}-{seg.index}.mp4"
        path.write_bytes(data)
        decoded = read_frames_rgb(path)
        assert len(decoded) == seg.frames, (seg.index, len(decoded), seg.frames)
        frames.append(decoded)
    assert sum(len(f) for f in frames) == manifest.frames
    return frames


def venv_bin() -> str:
    """The test interpreter's bin folder: framefleet, python3 with boto3, weed."""
    return str(Path(sys.executable).parent)
