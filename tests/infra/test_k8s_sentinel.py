"""The Kubernetes overlay "sentinel" (infra/k8s/overlays/sentinel), checked without a cluster.

Every overlay gets ``test_k8s.py``'s and ``test_k8s_network.py``'s checks (schemas, non-root,
no secret, policies). Here: what the Sentinel shape itself needs. Three Redis pods, each with a
Sentinel, started by the script that ``test_redis_ha.py`` runs for real, with names that the
headless Service gives them; the fleet's settings and KEDA's scaler pointing at those
Sentinels, under the name the script monitors; the documented Secret matching; the network
open between the nodes and to their clients only.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from producer.state.broker import same_server, sentinel_hosts
from tests.infra.k8s_netpol import allowed, pod_of
from tests.infra.k8s_render import (
    REPO,
    container_env,
    containers,
    of_kind,
    one,
    pod_specs,
    render,
    settings_of,
)
from tests.infra.redis_ha import SCRIPT, script_default

OVERLAY = "sentinel"
CLIENTS = ("framefleet-worker", "framefleet-exporter", "flower", "framefleet-api")


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return render(OVERLAY)


def node_names(objects: list[dict[str, Any]]) -> list[str]:
    """``<pod>.<service>`` of every pod the Redis StatefulSet makes."""
    redis = one(objects, "StatefulSet", "framefleet-redis")
    service = redis["spec"]["serviceName"]
    return [f"framefleet-redis-{i}.{service}" for i in range(redis["spec"]["replicas"])]


def documented_secret() -> dict[str, str]:
    """The ``create secret generic framefleet-redis`` of docs/deploy.md's Sentinel part, its
    shell variables expanded (the password as ``pw``)."""
    text = (REPO / "docs" / "deploy.md").read_text()
    part = text[text.index("**Deploy with Sentinel.**"):]
    block = part[:part.index("kubectl apply -k infra/k8s/overlays/sentinel")]
    variables = {"P": "pw", **dict(re.findall(r"(?m)^\s*(S\d)=(\S+)$", block))}
    literals = dict(re.findall(r'--from-literal=([a-z-]+)="?([^"\s]+)"?', block))

    def expand(value: str) -> str:
        return re.sub(r"\$(\w+)", lambda m: variables[m.group(1)], value)

    return {key: expand(value) for key, value in literals.items()}


def test_three_redis_pods_each_with_a_sentinel_started_by_the_script(
    objects: list[dict[str, Any]],
) -> None:
    redis = one(objects, "StatefulSet", "framefleet-redis")
    assert redis["spec"]["replicas"] == 3 and redis["spec"]["podManagementPolicy"] == "Parallel"
    pod = redis["spec"]["template"]["spec"]
    by_name = {c["name"]: c for c in pod["containers"]}
    assert set(by_name) == {"redis", "sentinel"}
    (ha,) = [v for v in pod["volumes"] if v["name"] == "ha"]
    (script,) = [c for c in of_kind(objects, "ConfigMap")
                 if c["metadata"]["name"] == ha["configMap"]["name"]]
    assert script["data"]["redis-ha.sh"] == SCRIPT.read_text()
    names = node_names(objects)
    for role, container in by_name.items():
        assert container["command"] == ["sh", "/ha/redis-ha.sh"] and container["args"] == [role]
        env = container_env(objects, container)
        assert env["HA_NODES"].split() == names, role
        # The pod's own name in that list: its host name plus the domain
        assert f"framefleet-redis-0{env['HA_DOMAIN']}" == names[0]
        secrets = {e["name"] for e in container["env"] if "valueFrom" in e}
        assert {"REDIS_PASSWORD", "REDISCLI_AUTH"} <= secrets, role
        assert {"/ha"} <= {m["mountPath"] for m in container["volumeMounts"]}, role
    assert {m["mountPath"] for m in by_name["redis"]["volumeMounts"]} >= {"/data"}
    # A writable folder for the Sentinel's own file (the root file system is read-only)
    sentinel_dir = script_default("HA_SENTINEL_DIR")
    mounts = {m["mountPath"]: m["name"] for m in by_name["sentinel"]["volumeMounts"]}
    assert {v["name"]: v for v in pod["volumes"]}[mounts[sentinel_dir]]["emptyDir"] == {}
    assert int(script_default("HA_QUORUM")) == 2  # two of the three Sentinels
    # A drain takes one node at a time
    (pdb,) = [p for p in of_kind(objects, "PodDisruptionBudget")
              if p["spec"]["selector"]["matchLabels"] == redis["spec"]["selector"]["matchLabels"]]
    assert pdb["spec"]["maxUnavailable"] == 1


def test_the_headless_service_gives_the_pods_their_names(objects: list[dict[str, Any]]) -> None:
    redis = one(objects, "StatefulSet", "framefleet-redis")
    service = one(objects, "Service", redis["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None"
    # Published before the pods are ready: a starting node looks for the others' Sentinels
    assert service["spec"]["publishNotReadyAddresses"] is True
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert ports == {"redis": int(script_default("HA_REDIS_PORT")),
                     "sentinel": int(script_default("HA_SENTINEL_PORT"))}


def test_every_redis_client_asks_the_sentinels(objects: list[dict[str, Any]]) -> None:
    master = script_default("HA_MASTER_NAME")
    for name, pod in pod_specs(objects):
        if name not in CLIENTS:
            continue
        (container,) = containers(pod)
        env = container_env(objects, container)
        assert env["FRAMEFLEET_SENTINEL_MASTER"] == master, name
        refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]
                if "valueFrom" in e and "secretKeyRef" in e["valueFrom"]}
        assert refs["FRAMEFLEET_SENTINEL_PASSWORD"] == {"name": "framefleet-redis",
                                                        "key": "password"}, name
        assert refs["FRAMEFLEET_BROKER_URL"]["name"] == "framefleet-redis", name


def test_the_documented_secret_names_the_sentinels(objects: list[dict[str, Any]]) -> None:
    secret = documented_secret()
    port = int(script_default("HA_SENTINEL_PORT"))
    nodes = [(n, port) for n in node_names(objects)]
    worker_env = container_env(objects, one(objects, "Deployment", "framefleet-worker")[
        "spec"]["template"]["spec"]["containers"][0])
    s = settings_of({**worker_env, "FRAMEFLEET_BROKER_URL": secret["broker-url"],
                     "FRAMEFLEET_RESULT_BACKEND": secret["result-backend"]})
    assert sentinel_hosts(s.broker_url) == nodes and sentinel_hosts(s.backend_url) == nodes
    assert same_server(s.broker_url, s.backend_url)  # the host-loss sweep runs
    # KEDA's addresses: the same Sentinels, comma-separated
    assert [tuple(a.rsplit(":", 1)) for a in secret["address"].split(",")] == [
        (n, str(p)) for n, p in nodes]


def test_keda_asks_the_sentinels_for_the_same_lists(objects: list[dict[str, Any]]) -> None:
    plain = one(render("self-contained"), "ScaledObject", "framefleet-worker")["spec"]["triggers"]
    triggers = one(objects, "ScaledObject", "framefleet-worker")["spec"]["triggers"]
    assert [t["metadata"]["listName"] for t in triggers] == [
        t["metadata"]["listName"] for t in plain]
    master = script_default("HA_MASTER_NAME")
    for t in triggers:
        assert t["type"] == "redis-sentinel" and t["metadata"]["sentinelMaster"] == master
    (auth,) = of_kind(objects, "TriggerAuthentication")
    params = {r["parameter"]: (r["name"], r["key"]) for r in auth["spec"]["secretTargetRef"]}
    assert params == {"addresses": ("framefleet-redis", "address"),
                      "password": ("framefleet-redis", "password"),
                      "sentinelPassword": ("framefleet-redis", "password")}


def test_the_nodes_reach_each_other_and_their_clients_reach_the_sentinels(
    objects: list[dict[str, Any]],
) -> None:
    redis_labels, redis_c = pod_of(objects, "framefleet-redis")
    node = (redis_labels, redis_c, None)
    keda = ({"app.kubernetes.io/name": "keda-operator"}, "keda")
    for port in (6379, 26379):
        # replication, and the Sentinels watching every node and each other
        assert allowed(objects, (redis_labels, "framefleet"), node, port)
        for client in CLIENTS:
            labels, _ = pod_of(objects, client)
            assert allowed(objects, (labels, "framefleet"), node, port), (client, port)
        # KEDA's operator asks a Sentinel, then reads the lists on the primary
        assert allowed(objects, keda, node, port)
        assert not allowed(objects, (None, "default"), node, port)
        assert not allowed(objects, ({"app.kubernetes.io/name": "other"}, "keda"), node, port)
    s3_labels, s3_c = pod_of(objects, "seaweedfs")
    assert not allowed(objects, (redis_labels, "framefleet"), (s3_labels, s3_c, None), 8333)


def test_keda_reaches_the_self_contained_redis() -> None:
    objects = render("self-contained")
    redis_labels, redis_c = pod_of(objects, "framefleet-redis")
    keda = ({"app.kubernetes.io/name": "keda-operator"}, "keda")
    assert allowed(objects, keda, (redis_labels, redis_c, None), 6379)
    assert not allowed(objects, ({"app.kubernetes.io/name": "other"}, "keda"),
                       (redis_labels, redis_c, None), 6379)
