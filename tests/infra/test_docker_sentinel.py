"""The compose profile "sentinel" (docker/compose.sentinel.yaml over docker/compose.yaml),
checked without a docker engine: Debian's docker-compose resolves the two files with the
profiles, and the result is held to what the fleet and the start script
(``infra/k8s/overlays/sentinel/redis-ha.sh``, run for real by ``test_redis_ha.py``) need.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from producer.state.broker import same_server, sentinel_hosts
from tests.infra.k8s_render import settings_of
from tests.infra.redis_ha import REPO, SCRIPT, script_default
from tests.infra.test_docker import COMPOSE, DOCKER, DOCKER_COMPOSE, SECRETS
from tests.require import require_binary

SENTINEL_FILE = DOCKER / "compose.sentinel.yaml"
HA = ("redis", "redis-replica", "sentinel-0", "sentinel-1", "sentinel-2")


def resolve(tmp: Path, *profiles: str) -> subprocess.CompletedProcess[str]:
    exe = require_binary("docker-compose", DOCKER_COMPOSE)
    empty = tmp / "empty.env"
    empty.write_text("")
    flags = [a for p in profiles for a in ("--profile", p)]
    return subprocess.run(
        [exe, "--env-file", str(empty), "-f", str(COMPOSE), "-f", str(SENTINEL_FILE), *flags,
         "config"],
        env={"PATH": "/usr/bin:/bin", **SECRETS}, capture_output=True, text=True, timeout=120,
        check=False)


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    done = resolve(tmp_path_factory.mktemp("compose"), "cpu", "sentinel")
    assert done.returncode == 0, done.stderr
    return dict(yaml.safe_load(done.stdout)["services"])


def framefleet_services(services: dict[str, Any]) -> dict[str, Any]:
    return {n: s for n, s in services.items()
            if "FRAMEFLEET_BROKER_URL" in (s.get("environment") or {})}


def test_the_profile_adds_a_replica_and_a_sentinel_trio(services: dict[str, Any]) -> None:
    assert set(HA) <= set(services)
    for name in HA[1:]:
        assert services[name]["profiles"] == ["sentinel"], name
    assert "profiles" not in services["redis"]  # the first primary starts with every profile
    for name in HA:
        service = services[name]
        assert service["entrypoint"] == ["sh", "/ha/redis-ha.sh"], name
        assert service["command"] == ["sentinel" if name.startswith("sentinel") else "redis"]
        assert service["user"] == "redis", name
        # Only the first primary keeps compose.yaml's loopback port (producers on the host)
        assert ("ports" in service) == (name == "redis"), name
        mounted = {v.split(":")[1]: v.split(":")[0] for v in service["volumes"]}
        assert Path(mounted["/ha/redis-ha.sh"]) == SCRIPT, name
        env = service["environment"]
        assert env["HA_SELF"] == name and env["REDIS_PASSWORD"] == SECRETS["REDIS_PASSWORD"]
        # The names the script is given are the services that exist
        assert env["HA_NODES"].split() == ["redis", "redis-replica"]
        assert env["HA_SENTINELS"].split() == ["sentinel-0", "sentinel-1", "sentinel-2"]
        assert service["healthcheck"]["test"][:2] == ["CMD", "redis-cli"], name
    # Two of three Sentinels agree before a failover (the script's quorum), so one may be away
    assert int(script_default("HA_QUORUM")) == 2
    # Each Redis node keeps its append-only file on its own volume
    data = {n: [v for v in services[n]["volumes"] if v.split(":")[1] == "/data"]
            for n in ("redis", "redis-replica")}
    assert data["redis"][0].split(":")[0] != data["redis-replica"][0].split(":")[0]


def test_every_framefleet_service_asks_the_sentinels(services: dict[str, Any]) -> None:
    clients = framefleet_services(services)
    assert {"worker-cpu0", "worker-cpu1", "exporter", "flower", "api"} <= set(clients)
    master = script_default("HA_MASTER_NAME")
    port = int(script_default("HA_SENTINEL_PORT"))
    for name, service in clients.items():
        env = service["environment"]
        s = settings_of(env)
        assert s.sentinel_master == master, name
        assert s.sentinel_password is not None, name
        for url, db in ((s.broker_url, "0"), (s.backend_url, "1")):
            assert sentinel_hosts(url) == [(f"sentinel-{i}", port) for i in range(3)], name
            for part in url.split(";"):
                split = urlsplit(part)
                assert split.path == f"/{db}" and split.password == SECRETS["REDIS_PASSWORD"]
        # One server for the broker and the results: the host-loss sweep runs
        assert same_server(s.broker_url, s.backend_url), name
        waits = service["depends_on"]
        for sentinel in HA[2:]:
            assert waits[sentinel]["condition"] == "service_healthy", (name, sentinel)


def test_the_gpu_workers_ask_the_sentinels_too(tmp_path: Path) -> None:
    done = resolve(tmp_path, "gpu8", "sentinel")
    assert done.returncode == 0, done.stderr
    clients = framefleet_services(dict(yaml.safe_load(done.stdout)["services"]))
    assert {f"worker-gpu{i}" for i in range(8)} <= set(clients)
    for name, service in clients.items():
        assert service["environment"]["FRAMEFLEET_BROKER_URL"].startswith("sentinel://"), name


def test_the_sentinel_file_names_no_service_compose_lacks() -> None:
    base = set(yaml.safe_load(COMPOSE.read_text())["services"])
    extra = set(yaml.safe_load(SENTINEL_FILE.read_text())["services"])
    assert extra - base == set(HA[1:])
    assert SCRIPT.is_relative_to(REPO) and SCRIPT.exists()
