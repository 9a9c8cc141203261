"""The start script of the Sentinel deployments (``infra/k8s/overlays/sentinel/redis-ha.sh``,
run by the Kubernetes overlay and the compose file), run for real on loopback.

Three Redis nodes and three Sentinels, each started by the script as a pod or a container
starts it, on 127.0.0.2-4 (one address per "host", the same ports on each, as in a cluster):
the first start elects the first node, the fleet's client finds the primary through the
Sentinels, a SIGKILLed primary is replaced, and the node and the Sentinel that come back ask the
Sentinels first and rejoin behind the promoted primary instead of starting a second one.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from producer.settings import Settings
from producer.state.broker import redis_client
from tests.infra.redis_ha import SCRIPT, script_default
from tests.require import require_binary
from tests.services import REDIS_INSTALL, _Process, free_ports
from tests.waiting import wait_for

NODES = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
PASSWORD = "test-ha-password"
MASTER = script_default("HA_MASTER_NAME")


class HaProcess(_Process):
    """``redis-ha.sh redis|sentinel`` as one node of the group runs it."""

    def __init__(self, role: str, address: str, env: dict[str, str], workdir: Path) -> None:
        super().__init__(f"{role} {address}", workdir / f"{role}-{address}.log")
        self.role, self.address, self.env, self.workdir = role, address, env, workdir

    def start(self) -> None:
        self._spawn(["sh", str(SCRIPT), self.role], self.env, self.workdir)


class Group:
    def __init__(self, tmp: Path) -> None:
        binary = require_binary("redis-server", REDIS_INSTALL)
        require_binary("redis-cli", REDIS_INSTALL)
        self.redis_port, self.sentinel_port = free_ports(2)
        self.redis: dict[str, HaProcess] = {}
        self.sentinels: dict[str, HaProcess] = {}
        for ip in NODES:
            data, sentinel_dir = tmp / ip / "data", tmp / ip / "sentinel"
            data.mkdir(parents=True)
            sentinel_dir.mkdir()
            env = {
                "PATH": f"{Path(binary).parent}{os.pathsep}/usr/bin:/bin",
                "REDIS_PASSWORD": PASSWORD, "HA_NODES": " ".join(NODES), "HA_SELF": ip,
                "HA_BIND": ip, "HA_REDIS_PORT": str(self.redis_port),
                "HA_SENTINEL_PORT": str(self.sentinel_port), "HA_DATA": str(data),
                "HA_SENTINEL_DIR": str(sentinel_dir), "HA_DOWN_AFTER_MS": "1000",
            }
            self.redis[ip] = HaProcess("redis", ip, env, tmp)
            self.sentinels[ip] = HaProcess("sentinel", ip, env, tmp)

    def url(self) -> str:
        return ";".join(f"sentinel://:{PASSWORD}@{ip}:{self.sentinel_port}/0" for ip in NODES)

    def view(self, ip: str) -> dict[str, Any]:
        """What the Sentinel on ``ip`` says of the primary ({} if it does not answer)."""
        client = redis.Redis(host=ip, port=self.sentinel_port, password=PASSWORD,
                             socket_timeout=1, socket_connect_timeout=1)
        try:
            return dict(client.sentinel_master(MASTER))
        except redis.RedisError:
            return {}
        finally:
            client.close()

    def agreed(self, primary: str, replicas: int = 2) -> bool:
        """Every Sentinel names ``primary``, sees ``replicas`` replicas and the two others."""
        views = [self.view(ip) for ip in NODES]
        return all(v.get("ip") == primary and v.get("num-slaves") == replicas
                   and v.get("num-other-sentinels") == 2 and "s_down" not in v.get("flags", "")
                   for v in views)

    def node(self, ip: str) -> redis.Redis:
        return redis.Redis(host=ip, port=self.redis_port, password=PASSWORD, socket_timeout=2)

    def stop(self) -> None:
        for p in [*self.sentinels.values(), *self.redis.values()]:
            p.stop()


@pytest.fixture
def group(tmp_path: Path) -> Iterator[Group]:
    g = Group(tmp_path)
    try:
        yield g
    finally:
        g.stop()


def test_the_script_passes_shellcheck() -> None:
    exe = require_binary("shellcheck", "the shellcheck package (apt-get install shellcheck)")
    done = subprocess.run([exe, "--shell=sh", str(SCRIPT)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.timeout(180)
def test_a_group_started_by_the_script_fails_over_and_takes_its_nodes_back(
    group: Group,
) -> None:
    # Given the group's first start: every node and Sentinel through the script
    for p in [*group.redis.values(), *group.sentinels.values()]:
        p.start()
    first = NODES[0]
    wait_for(lambda: group.agreed(first), 60, "three Sentinels agreeing on the first node",
             interval=0.2)
    assert "starts as the primary" in group.redis[first].log_text()
    # Then the fleet's client finds the primary through the Sentinels, by their password too
    settings = Settings(broker_url=group.url(), sentinel_master=MASTER,
                        sentinel_password=PASSWORD)
    client = redis_client(group.url(), settings, socket_timeout=2, socket_connect_timeout=1)
    client.set("job", "kept")
    wait_for(lambda: client.wait(2, 1000) == 2, 30, "the key on both replicas", interval=0.2)
    # When the primary is SIGKILLed
    group.redis[first].kill(signal.SIGKILL)
    promoted = wait_for(lambda: next((v["ip"] for v in map(group.view, NODES)
                                      if v.get("ip") not in (None, first)), None),
                        30, "a promoted replica", interval=0.2)
    # Then the client writes to the promoted replica, through the same URL
    wait_for(lambda: _writes(client), 20, "a write after the failover", interval=0.2)
    # and the killed node, started again by the script, asks the Sentinels and comes back as
    # a replica of the promoted one, not as a second primary
    group.redis[first].start()
    wait_for(lambda: group.agreed(promoted), 60, "the old primary back as a replica",
             interval=0.2)
    assert f"starts as a replica of {promoted}" in group.redis[first].log_text()
    old = group.node(first)
    assert old.info("replication")["role"] == "slave" and old.get("job") == b"kept"
    old.close()
    # and so does a Sentinel that restarts: it watches the primary the others watch
    group.sentinels[first].kill(signal.SIGKILL)
    group.sentinels[first].start()
    wait_for(lambda: group.agreed(promoted), 60, "the restarted Sentinel", interval=0.2)
    assert f"watches {MASTER} at {promoted}" in group.sentinels[first].log_text()
    assert client.get("job") == b"kept"
    client.close()


def _writes(client: redis.Redis) -> bool:
    try:
        return bool(client.set("after", "failover"))
    except redis.RedisError:
        return False
