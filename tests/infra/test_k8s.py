"""The Kubernetes deployment (infra/k8s), checked without a cluster.

``kubectl kustomize`` renders every overlay; kubernetes-validate checks each core object
against the Kubernetes OpenAPI schemas offline (strict: unknown fields fail), and the custom
resources (KEDA, Prometheus Operator, External Secrets) against the structural models of
``tests/infra/k8s_models.py``. The rendered objects are then held to the fleet's rules, each
read from the code that defines it rather than restated here: one GPU per worker pod, a grace
period covering ``FRAMEFLEET_MAX_TIME_LIMIT_S``, no secret in the manifests, non-root
containers, a scaler on the Redis lists that workers consume (kombu's naming, the launcher's
queue), scrape ports that follow ``producer.ports.metrics_port_for`` (compose too), and
network policies that let through only what must talk.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import pytest

from producer.settings import Settings
from tests.infra.k8s_models import MODELS
from tests.infra.k8s_render import (
    REPO,
    container_env,
    containers,
    of_kind,
    one,
    pod_specs,
    render,
    settings_of,
    walk_strings,
    worker,
)
from tests.require import missing
from worker.lifecycle.poolwatch import start_timeout

KEDA_OVERLAYS = ("eks-production", "self-contained")
VALIDATE = "kubernetes-validate (pip install kubernetes-validate: the test extra)"
# The oldest Kubernetes minor that EKS still supports as standard, and the newest schema set.
K8S_VERSIONS = ("1.31", "latest")
GPU = "nvidia.com/gpu"
SECRETISH = re.compile(r"PASSWORD|SECRET|TOKEN|CREDENTIAL|_KEY$|_KEY_ID$|AUTH", re.IGNORECASE)
# The cold host that README.md's "what a cold host costs" sizes the start for: seconds.
COLD_HOST_S = 15 * 60
# scheme://user:password@ with a password that is not a reference ($(VAR), {{ .tpl }}).
URL_PASSWORD = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s:@]*:(?!\$\(|\{\{)[^@\s/]+@", re.IGNORECASE)



# --- render and validate ----------------------------------------------------------------------


def _validator() -> Any:
    try:
        import kubernetes_validate
    except ImportError:
        missing("the kubernetes_validate module", VALIDATE)
    return kubernetes_validate


def test_every_overlay_renders_into_the_framefleet_namespace(objects: list[dict[str, Any]]) -> None:
    kinds = {o["kind"] for o in objects}
    assert {"Namespace", "ServiceAccount", "Deployment", "PodDisruptionBudget",
            "NetworkPolicy", "ServiceMonitor"} <= kinds
    assert {d["metadata"]["name"] for d in of_kind(objects, "Deployment")} >= {
        "framefleet-worker", "framefleet-exporter", "flower", "framefleet-api"}
    for o in objects:
        if o["kind"] != "Namespace":
            assert o["metadata"].get("namespace") == "framefleet", o["metadata"]["name"]


def test_core_objects_validate_against_the_kubernetes_schemas(
    objects: list[dict[str, Any]],
) -> None:
    kubernetes_validate = _validator()
    core = [o for o in objects if o["kind"] not in MODELS]
    assert core
    errors = []
    for version in K8S_VERSIONS:
        wanted = kubernetes_validate.latest_version() if version == "latest" else version
        for o in core:
            try:
                kubernetes_validate.validate(o, wanted, strict=True)
            except kubernetes_validate.ValidationError as e:
                errors.append(f"{version} {o['kind']}/{o['metadata']['name']}: {e.message}")
            except kubernetes_validate.SchemaNotFoundError as e:
                errors.append(f"{version}: {e.message}")
    assert not errors, "\n".join(errors)


def test_custom_resources_match_their_structural_models(objects: list[dict[str, Any]]) -> None:
    custom = [o for o in objects if o["kind"] in MODELS]
    assert custom
    for o in custom:
        MODELS[o["kind"]].model_validate(o)


def test_scaled_object_hpa_behavior_is_a_valid_autoscaling_v2_behavior() -> None:
    # KEDA hands this block to the HPA it creates: check it with the HPA's own schema.
    kubernetes_validate = _validator()

    for overlay in KEDA_OVERLAYS:
        scaled = one(render(overlay), "ScaledObject", "framefleet-worker")
        hpa = {
            "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "probe"},
            "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "x"}, "maxReplicas": 1,
                     **scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]},
        }
        kubernetes_validate.validate(hpa, kubernetes_validate.latest_version(), strict=True)


def test_a_misspelt_custom_resource_field_is_caught() -> None:
    scaled = one(render("eks-production"), "ScaledObject", "framefleet-worker")
    wrong = json.loads(json.dumps(scaled))
    wrong["spec"]["minReplicas"] = wrong["spec"].pop("minReplicaCount")
    with pytest.raises(ValueError, match="minReplicas"):
        MODELS["ScaledObject"].model_validate(wrong)
    wrong = json.loads(json.dumps(scaled))
    wrong["spec"]["triggers"][0]["metadata"]["listLength"] = 2  # KEDA's metadata is all strings
    with pytest.raises(ValueError, match="listLength"):
        MODELS["ScaledObject"].model_validate(wrong)


# --- GPUs, time limits, shutdown --------------------------------------------------------------


def _gpus(resources: dict[str, Any], which: str) -> int:
    return int(resources.get(which, {}).get(GPU, 0))


def test_every_worker_pod_requests_exactly_one_gpu(objects: list[dict[str, Any]]) -> None:
    pods = dict(pod_specs(objects))
    for name, pod in pods.items():
        gpu_requests = [_gpus(c.get("resources", {}), "requests") for c in containers(pod)]
        gpu_limits = [_gpus(c.get("resources", {}), "limits") for c in containers(pod)]
        if name == "framefleet-worker":
            # One container, one GPU: the pod and its single worker own exactly one device.
            assert len(containers(pod)) == 1
            assert gpu_requests == [1] and gpu_limits == [1], (gpu_requests, gpu_limits)
            tolerated = {t["key"] for t in pod["spec"].get("tolerations", [])}
            assert GPU in tolerated  # GPU node groups are tainted nvidia.com/gpu
        else:
            assert sum(gpu_requests) + sum(gpu_limits) == 0, f"{name} asks for a GPU"


def test_workers_run_the_launcher_and_are_ready_once_warmed_up(
    objects: list[dict[str, Any]],
) -> None:
    (container,) = worker(objects)["spec"]["template"]["spec"]["containers"]
    # The image's ENTRYPOINT is framefleet: `framefleet worker`, never a hand-made celery line.
    assert "command" not in container
    assert container["args"][:3] == ["worker", "--gpus", "all"]
    for probe in ("startupProbe", "readinessProbe"):
        assert container[probe]["exec"]["command"][:2] == ["framefleet", "healthcheck"], probe
    assert "livenessProbe" not in container
    env = container_env(objects, container)
    s = settings_of(env)
    assert s.warmup_decoder is not None and s.device == "cuda"
    cache = env["FRAMEFLEET_COMPILE_CACHE_DIR"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert any(cache.startswith(path.rstrip("/") + "/") for path in mounts), cache


def test_the_startup_probe_allows_a_cold_host(objects: list[dict[str, Any]]) -> None:
    (container,) = worker(objects)["spec"]["template"]["spec"]["containers"]
    startup, readiness = container["startupProbe"], container["readinessProbe"]
    budget = startup["periodSeconds"] * startup["failureThreshold"]
    # At least the documented cold host (a model folder on a volume restored from a snapshot,
    # sizes compiled cold), and never shorter than the start the worker itself allows: the
    # worker's own watch, which logs why, gives up first.
    assert budget >= COLD_HOST_S, budget
    assert budget > start_timeout(settings_of(container_env(objects, container))), budget
    # Ready is seen soon after it comes, and a probe that times out is a failure, not a hang.
    assert startup["periodSeconds"] <= 10
    assert startup["timeoutSeconds"] > _healthcheck_timeout(startup)
    # The startup probe holds the others back: no fixed delay guesses the start any more.
    assert readiness.get("initialDelaySeconds", 0) == 0
    assert readiness["timeoutSeconds"] > _healthcheck_timeout(readiness)


def _healthcheck_timeout(probe: dict[str, Any]) -> float:
    command = probe["exec"]["command"]
    return float(command[command.index("--timeout") + 1])


def test_grace_period_covers_the_longest_job(objects: list[dict[str, Any]]) -> None:
    pod = worker(objects)["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    s = settings_of(container_env(objects, container))
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    assert grace >= s.max_time_limit_s, (grace, s.max_time_limit_s)
    # And below the visibility timeout: a job still finishing must not go to a second worker.
    assert grace < s.visibility_timeout, (grace, s.visibility_timeout)


def test_service_links_cannot_shadow_a_setting(objects: list[dict[str, Any]]) -> None:
    # Kubernetes puts <SERVICE>_PORT=tcp://... and friends into every pod that has service
    # links: Service "framefleet-exporter" would set FRAMEFLEET_EXPORTER_PORT to a URL.
    fields = {f"FRAMEFLEET_{name.upper()}" for name in Settings.model_fields}
    injected = set()
    for service in of_kind(objects, "Service"):
        if service["spec"].get("clusterIP") == "None":
            continue  # headless Services inject nothing
        prefix = service["metadata"]["name"].upper().replace("-", "_")
        injected |= {f"{prefix}_SERVICE_HOST", f"{prefix}_SERVICE_PORT", f"{prefix}_PORT"}
    collisions = injected & fields
    assert "FRAMEFLEET_EXPORTER_PORT" in collisions
    for name, pod in pod_specs(objects):
        assert pod["spec"].get("enableServiceLinks") is False, (name, sorted(collisions))


def test_workers_are_disrupted_one_at_a_time(objects: list[dict[str, Any]]) -> None:
    pdbs = [p for p in of_kind(objects, "PodDisruptionBudget")
            if p["spec"]["selector"]["matchLabels"].items()
            <= worker(objects)["spec"]["template"]["metadata"]["labels"].items()]
    assert len(pdbs) == 1
    assert pdbs[0]["spec"]["maxUnavailable"] == 1
    assert pdbs[0]["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert "replicas" not in worker(objects)["spec"]  # the scaler owns it


# --- secrets and identity ---------------------------------------------------------------------


def _referenced_secret_keys(objects: list[dict[str, Any]]) -> set[tuple[str, str]]:
    refs = set()
    for _, pod in pod_specs(objects):
        for c in containers(pod):
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    refs.add((ref["name"], ref["key"]))
            for source in c.get("envFrom", []):
                assert "secretRef" not in source, "whole-Secret envFrom hides what is read"
    for auth in of_kind(objects, "TriggerAuthentication"):
        refs |= {(r["name"], r["key"]) for r in auth["spec"]["secretTargetRef"]}
    return refs


def _documented_secrets() -> dict[str, set[str]]:
    """Secrets docs/deploy.md tells the operator to create: name -> keys (--from-literal)."""
    text = (REPO / "docs" / "deploy.md").read_text()
    found: dict[str, set[str]] = {}
    for m in re.finditer(r"create secret generic ([a-z0-9-]+)((?:[^\n]*\\\n)*[^\n]*)", text):
        found[m.group(1)] = set(re.findall(r"--from-literal=([a-z0-9-]+)=", m.group(2)))
    return found


def test_no_secret_value_is_in_the_manifests(objects: list[dict[str, Any]]) -> None:
    assert not of_kind(objects, "Secret"), "Secrets are made outside the manifests"
    for name, pod in pod_specs(objects):
        for c in containers(pod):
            for e in c.get("env", []):
                if SECRETISH.search(e["name"]) or e["name"].endswith(("_URL", "_BACKEND")):
                    if "value" in e:
                        assert not SECRETISH.search(e["name"]), f"{name}: {e['name']} literal"
                        assert not URL_PASSWORD.search(e["value"]), f"{name}: {e['name']}"
            args = [*c.get("command", []), *c.get("args", [])]
            for flag, value in itertools.pairwise(args):
                if flag.startswith("-") and re.search(r"pass|secret|token", flag, re.I):
                    assert re.fullmatch(r"\$\([A-Z_]+\)", value), f"{name}: {flag} {value}"
    for config in of_kind(objects, "ConfigMap"):
        assert not [k for k in config.get("data", {}) if SECRETISH.search(k)], config["data"]
    for text in (s for o in objects for s in walk_strings(o)):
        assert not URL_PASSWORD.search(text), text


def test_every_secret_read_is_made_by_an_external_secret_or_documented(
    objects: list[dict[str, Any]],
) -> None:
    made = {e["spec"]["target"]["name"]: set(e["spec"]["target"]["template"]["data"])
            for e in of_kind(objects, "ExternalSecret")}
    known = made or _documented_secrets()
    for secret, key in _referenced_secret_keys(objects):
        assert secret in known, f"nothing makes Secret {secret}"
        assert key in known[secret], f"Secret {secret} is made without key {key}"


def test_the_service_account_has_no_api_access(objects: list[dict[str, Any]]) -> None:
    rbac = {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}
    assert not [o for o in objects if o["kind"] in rbac]
    accounts = {a["metadata"]["name"]: a for a in of_kind(objects, "ServiceAccount")}
    assert all(a["automountServiceAccountToken"] is False for a in accounts.values())
    for name, pod in pod_specs(objects):
        assert pod["spec"]["serviceAccountName"] in accounts, name
        assert pod["spec"]["automountServiceAccountToken"] is False, name


def test_eks_uses_the_irsa_role_and_no_keys() -> None:
    for overlay in ("eks-production", "hpa"):
        objects = render(overlay)
        account = one(objects, "ServiceAccount", "framefleet")
        role = account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"]
        assert re.fullmatch(r"arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]+", role)
        names = {e["name"] for _, p in pod_specs(objects) for c in containers(p)
                 for e in c.get("env", [])}
        assert not names & {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}, overlay
        # The broker is ElastiCache over TLS with certificate checks, for Celery and KEDA.
        (made,) = of_kind(objects, "ExternalSecret")
        data = made["spec"]["target"]["template"]["data"]
        for key in ("broker-url", "result-backend"):
            assert data[key].startswith("rediss://") and "ssl_cert_reqs=required" in data[key]
        for auth in of_kind(objects, "TriggerAuthentication"):
            tls = [r for r in auth["spec"]["secretTargetRef"] if r["parameter"] == "tls"]
            assert tls and data[tls[0]["key"]] == "enable"


def test_every_container_runs_as_non_root(objects: list[dict[str, Any]]) -> None:
    (namespace,) = of_kind(objects, "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for name, pod in pod_specs(objects):
        pod_ctx = pod["spec"].get("securityContext", {})
        for c in containers(pod):
            ctx = {**pod_ctx, **c.get("securityContext", {})}
            where = f"{name}/{c['name']}"
            assert ctx.get("runAsNonRoot") is True, where
            assert isinstance(ctx.get("runAsUser"), int) and ctx["runAsUser"] > 0, where
            assert ctx.get("allowPrivilegeEscalation") is False, where
            assert ctx.get("privileged", False) is False, where
            assert ctx.get("capabilities", {}).get("drop") == ["ALL"], where
            assert not ctx.get("capabilities", {}).get("add"), where
            assert ctx.get("seccompProfile", {}).get("type") == "RuntimeDefault", where
            assert ctx.get("readOnlyRootFilesystem") is True, where
        host = {k for k in ("hostNetwork", "hostPID", "hostIPC") if pod["spec"].get(k)}
        assert not host, name
        assert not [v for v in pod["spec"].get("volumes", []) if "hostPath" in v], name
