"""Kubernetes network policies: deny by default, each backend answers its clients only, the
workers and the API gateway reach what they must and nothing else."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.infra.k8s_netpol import allowed, pod_of, port_number, selects
from tests.infra.k8s_render import (
    REPO,
    container_env,
    of_kind,
    one,
    render,
    settings_of,
    worker,
)

# --- network policies -------------------------------------------------------------------------


PROMETHEUS = ({"app.kubernetes.io/name": "prometheus"}, "monitoring")


def test_network_policies_deny_by_default(objects: list[dict[str, Any]]) -> None:
    deny = [p for p in of_kind(objects, "NetworkPolicy") if p["spec"]["podSelector"] == {}
            and set(p["spec"]["policyTypes"]) == {"Ingress", "Egress"}
            and not p["spec"].get("ingress") and not p["spec"].get("egress")]
    assert len(deny) == 1
    worker_labels, worker_c = pod_of(objects, "framefleet-worker")
    flower_labels, flower_c = pod_of(objects, "flower")
    exporter_labels, _ = pod_of(objects, "framefleet-exporter")
    metrics = port_number(worker_c, "metrics")
    assert allowed(objects, PROMETHEUS, (worker_labels, worker_c, None), metrics)
    assert not allowed(objects, PROMETHEUS, (worker_labels, worker_c, None), metrics + 1)
    assert not allowed(objects, (flower_labels, "framefleet"), (worker_labels, worker_c, None),
                       metrics)
    assert not allowed(objects, (None, "default"), (flower_labels, flower_c, None), 5555)
    assert not allowed(objects, (exporter_labels, "framefleet"), (None, None, "anywhere"), 443)


def test_self_contained_backends_answer_their_clients_only() -> None:
    objects = render("self-contained")
    redis_labels, redis_c = pod_of(objects, "framefleet-redis")
    s3_labels, s3_c = pod_of(objects, "seaweedfs")
    for client in ("framefleet-worker", "framefleet-exporter", "flower", "framefleet-api"):
        labels, _ = pod_of(objects, client)
        assert allowed(objects, (labels, "framefleet"), (redis_labels, redis_c, None), 6379)
        may_s3 = client in ("framefleet-worker", "framefleet-api")
        assert allowed(objects, (labels, "framefleet"), (s3_labels, s3_c, None), 8333) == may_s3
    assert not allowed(objects, (None, "default"), (redis_labels, redis_c, None), 6379)


def test_eks_workers_reach_redis_s3_and_the_spot_notice() -> None:
    objects = render("eks-production")
    labels, container = pod_of(objects, "framefleet-worker")
    s = settings_of(container_env(objects, container))
    assert s.spot_watch is True
    worker_src = (labels, "framefleet")
    assert allowed(objects, worker_src, (None, None, "in-block"), 6379)
    assert allowed(objects, worker_src, (None, None, "anywhere"), 443)
    imds = [r for p in of_kind(objects, "NetworkPolicy")
            if selects(p["spec"]["podSelector"], labels) for r in p["spec"].get("egress", [])
            if any(t.get("ipBlock", {}).get("cidr") == "169.254.169.254/32" for t in r["to"])]
    assert imds and imds[0]["ports"] == [{"protocol": "TCP", "port": 80}]
    assert s.imds_url == "http://169.254.169.254"
    # The price in cost reports is that of the only instance type and capacity allowed.
    pod = worker(objects)["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": s.instance_type}
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    values = {v.lower() for t in terms["nodeSelectorTerms"] for e in t["matchExpressions"]
              for v in e["values"]}
    assert values == {s.capacity}


# --- the API gateway -------------------------------------------------------------------------


INGRESS = ({"app.kubernetes.io/name": "ingress-nginx"}, "ingress-nginx")


def test_only_the_ingress_reaches_the_api(objects: list[dict[str, Any]]) -> None:
    api_labels, api_c = pod_of(objects, "framefleet-api")
    port = port_number(api_c, "http")
    assert allowed(objects, INGRESS, (api_labels, api_c, None), port)
    assert not allowed(objects, INGRESS, (api_labels, api_c, None), port + 1)
    assert not allowed(objects, (None, "default"), (api_labels, api_c, None), port)
    assert not allowed(objects, PROMETHEUS, (api_labels, api_c, None), port)
    for other in ("framefleet-worker", "flower", "framefleet-exporter"):
        labels, _ = pod_of(objects, other)
        assert not allowed(objects, (labels, "framefleet"), (api_labels, api_c, None), port)
    # and the API reaches no worker, exporter or Flower port
    worker_labels, worker_c = pod_of(objects, "framefleet-worker")
    assert not allowed(objects, (api_labels, "framefleet"), (worker_labels, worker_c, None),
                       port_number(worker_c, "metrics"))


def test_the_api_reaches_redis_and_s3_only() -> None:
    objects = render("self-contained")
    api_labels, _ = pod_of(objects, "framefleet-api")
    src = (api_labels, "framefleet")
    assert not allowed(objects, src, (None, None, "anywhere"), 443)
    objects = render("eks-production")
    api_labels, _ = pod_of(objects, "framefleet-api")
    src = (api_labels, "framefleet")
    assert allowed(objects, src, (None, None, "in-block"), 6379)
    assert allowed(objects, src, (None, None, "anywhere"), 443)  # S3 and STS: HTTPS
    assert not allowed(objects, src, (None, None, "anywhere"), 80)
    assert not allowed(objects, src, (None, None, "anywhere"), 6379)


def test_the_api_runs_its_settings_probes_and_scaler(objects: list[dict[str, Any]]) -> None:
    deployment = one(objects, "Deployment", "framefleet-api")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == ["api"] and "replicas" not in deployment["spec"]
    s = settings_of(container_env(objects, container))
    assert str(s.api_addr) == "0.0.0.0" and (s.output_prefix or "").startswith("s3://")
    assert port_number(container, "http") == s.api_port
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    keys_dir = str(Path(str(s.api_keys_file)).parent)
    assert volumes[mounts[keys_dir]]["secret"]["secretName"] == "framefleet-api-keys"
    models = volumes[mounts[str(Path(str(s.api_models_file)).parent)]]["configMap"]["name"]
    config = [c for c in of_kind(objects, "ConfigMap") if c["metadata"]["name"] == models]
    assert config and Path(str(s.api_models_file)).name in config[0]["data"]
    (hpa,) = [h for h in of_kind(objects, "HorizontalPodAutoscaler")
              if h["spec"]["scaleTargetRef"]["name"] == "framefleet-api"]
    assert hpa["spec"]["minReplicas"] >= 2  # one replica lost still serves
    assert "create secret generic framefleet-api-keys" in (REPO / "docs/api.md").read_text()
