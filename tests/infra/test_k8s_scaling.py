"""Kubernetes: the scalers count the lists the workers consume; scrape ports follow the port rule
(compose too)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from producer.ports import metrics_port_for
from tests.infra.k8s_netpol import port_number
from tests.infra.k8s_render import (
    REPO,
    asg_backlog_target,
    consumed_lists,
    consumed_queue,
    container_env,
    of_kind,
    one,
    render,
    settings_of,
    worker,
)
from tests.require import require_binary
from tests.services import REDIS_INSTALL, RedisServer
from worker.lifecycle.launcher import plan_workers

KEDA_OVERLAYS = ("eks-production", "self-contained")
GPU = "nvidia.com/gpu"



# --- scaling on the queue ---------------------------------------------------------------------


def test_the_queue_the_workers_consume_is_what_the_exporter_counts() -> None:
    from producer.app import QUEUE
    from producer.ops.exporter import run_exporter
    from producer.state.keys import queue_lists as queue_names

    _, queue = consumed_queue()
    assert queue == QUEUE
    assert queue in inspect.signature(run_exporter).parameters["queues"].default
    assert consumed_lists() <= set(queue_names(queue))
    assert len(consumed_lists()) == 10  # priorities 0..9 are ten distinct lists


def test_kombu_fills_exactly_those_lists_on_a_real_redis(tmp_path: Path) -> None:
    # One message per priority step, sent as a producer sends (kombu, the app's transport
    # options): the lists that then exist in Redis are the ones KEDA must count.
    from celery.app.utils import find_app
    from kombu import Connection, Queue

    module, queue = consumed_queue()
    options = find_app(module).conf.broker_transport_options
    server = RedisServer(require_binary("redis-server", REDIS_INSTALL), tmp_path)
    server.start()
    try:
        with Connection(server.url, transport_options=options) as conn:
            producer = conn.Producer(serializer="json")
            for step in options["priority_steps"]:
                producer.publish({"step": step}, routing_key=queue, priority=step,
                                 declare=[Queue(queue, routing_key=queue)], retry=False)
        client = redis.Redis.from_url(server.url)
        try:
            lists = {k.decode() if isinstance(k, bytes) else k: client.llen(k)
                     for k in client.keys("*") if client.type(k) == b"list"}
        finally:
            client.close()
    finally:
        server.stop()
    assert set(lists) == consumed_lists(), lists
    assert set(lists.values()) == {1}
    scaled = one(render("eks-production"), "ScaledObject", "framefleet-worker")
    assert {t["metadata"]["listName"] for t in scaled["spec"]["triggers"]} == set(lists)


@pytest.mark.parametrize("overlay", KEDA_OVERLAYS)
def test_keda_counts_every_list_the_workers_consume(overlay: str) -> None:
    objects = render(overlay)
    scaled = one(objects, "ScaledObject", "framefleet-worker")
    spec = scaled["spec"]
    assert spec["scaleTargetRef"]["name"] == worker(objects)["metadata"]["name"]
    assert spec["minReplicaCount"] == 0
    triggers = spec["triggers"]
    assert {t["type"] for t in triggers} == {"redis"}
    lists = [t["metadata"]["listName"] for t in triggers]
    assert sorted(lists) == sorted(consumed_lists()), lists
    # One metric: the sum of every list, each once, per GPU (= per pod), as the ASG tracks.
    modifiers = spec["advanced"]["scalingModifiers"]
    terms = [term.strip() for term in modifiers["formula"].split("+")]
    assert sorted(terms) == sorted(t["name"] for t in triggers)
    assert modifiers["metricType"] == "AverageValue"
    assert modifiers["target"] == asg_backlog_target()
    # The database the workers use: the broker URL's /N.
    made = of_kind(objects, "ExternalSecret")
    if made:
        broker = made[0]["spec"]["target"]["template"]["data"]["broker-url"]
    else:
        deploy = (REPO / "docs" / "deploy.md").read_text()
        match = re.search(r"--from-literal=broker-url=(\S+)", deploy)
        assert match is not None
        broker = match.group(1)
    db = re.search(r":\d+/(\d+)", broker)
    assert db is not None
    assert {t["metadata"].get("databaseIndex", "0") for t in triggers} == {db.group(1)}
    auths = {a["metadata"]["name"] for a in of_kind(objects, "TriggerAuthentication")}
    assert {t["authenticationRef"]["name"] for t in triggers} <= auths


def test_the_hpa_alternative_scales_on_the_exporters_queue_depth() -> None:
    from producer.ops.exporter import QUEUE_DEPTH

    objects = render("hpa")
    assert not of_kind(objects, "ScaledObject")
    (hpa,) = [h for h in of_kind(objects, "HorizontalPodAutoscaler")
              if h["spec"]["scaleTargetRef"]["name"] != "framefleet-api"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == worker(objects)["metadata"]["name"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "External"
    assert metric["external"]["metric"]["name"] == QUEUE_DEPTH._name
    assert metric["external"]["metric"]["selector"]["matchLabels"] == {
        "queue": consumed_queue()[1]}
    assert metric["external"]["target"] == {"type": "AverageValue",
                                            "averageValue": asg_backlog_target()}


# --- metrics ports: one rule with compose -----------------------------------------------------


def test_the_launcher_follows_the_port_rule() -> None:
    for base in (9400, 19400, 0):
        slots = plan_workers([0, 1, 5], cpu=2, metrics_port=base)
        expected = [metrics_port_for(base, gpu=i) for i in (0, 1, 5)]
        expected += [metrics_port_for(base, cpu=j) for j in (0, 1)]
        assert [int(s.env["FRAMEFLEET_METRICS_PORT"]) for s in slots] == expected



def _scraped_port(objects: list[dict[str, Any]], deployment: str) -> tuple[str, int]:
    """(job, container port) that the ServiceMonitor scrapes for ``deployment``'s pods."""
    pod = one(objects, "Deployment", deployment)["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    labels = pod["metadata"]["labels"]
    (service,) = [s for s in of_kind(objects, "Service")
                  if s["spec"]["selector"].items() <= labels.items()]
    (monitor,) = [m for m in of_kind(objects, "ServiceMonitor")
                  if m["spec"]["selector"]["matchLabels"].items()
                  <= service["metadata"]["labels"].items()]
    (endpoint,) = monitor["spec"]["endpoints"]
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    (job,) = [r["replacement"] for r in endpoint["relabelings"] if r["targetLabel"] == "job"]
    number = port_number(container, port["targetPort"])
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(number)
    return job, number


def test_scrape_targets_follow_the_metrics_port_rule(objects: list[dict[str, Any]]) -> None:
    # A pod owns one GPU, which it sees as index 0: it serves on metrics_port_for(base, gpu=0).
    (container,) = worker(objects)["spec"]["template"]["spec"]["containers"]
    s = settings_of(container_env(objects, container))
    job, port = _scraped_port(objects, "framefleet-worker")
    assert port == metrics_port_for(s.metrics_port, gpu=0) != 0
    (exporter,) = one(objects, "Deployment", "framefleet-exporter")["spec"]["template"]["spec"][
        "containers"]
    exporter_job, exporter_port = _scraped_port(objects, "framefleet-exporter")
    assert exporter_port == settings_of(container_env(objects, exporter)).exporter_port
    (flower,) = one(objects, "Deployment", "flower")["spec"]["template"]["spec"]["containers"]
    flower_job, flower_port = _scraped_port(objects, "flower")
    assert f"--port={flower_port}" in flower["args"]
    # The same three jobs, by name, as the compose Prometheus: alerts and dashboards carry over.
    compose_jobs = {c["job_name"] for c in _prometheus_config()["scrape_configs"]}
    assert {job, exporter_job, flower_job} == compose_jobs


def _prometheus_config() -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load((REPO / "infra/prometheus/prometheus.yml").read_text())
    return config


def test_compose_scrape_targets_follow_the_same_rule() -> None:
    services = yaml.safe_load((REPO / "docker/compose.yaml").read_text())["services"]
    (workers,) = [c for c in _prometheus_config()["scrape_configs"]
                  if c["job_name"] == "framefleet-worker"]
    scraped = {name: sd["port"] for sd in workers["dns_sd_configs"] for name in sd["names"]}
    checked = 0
    for name, service in services.items():
        command = service.get("command", ["worker", "--gpus", "all"])
        if not name.startswith("worker-") or command[0] != "worker":
            continue
        base = int(service["environment"]["FRAMEFLEET_METRICS_PORT"])
        if "--cpu" in command:
            ports = [metrics_port_for(base, cpu=j)
                     for j in range(int(command[command.index("--cpu") + 1]))]
        else:  # the container is given one GPU, which it sees as index 0
            ports = [metrics_port_for(base, gpu=0)]
        assert [scraped[name]] == ports, (name, scraped.get(name), ports)
        checked += 1
    assert checked == 10  # 8 GPU containers, 2 CPU containers
