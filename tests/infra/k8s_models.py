"""Structural models of the custom resources in infra/k8s, for which kubernetes-validate has no
schema: KEDA's ScaledObject and TriggerAuthentication (keda.sh/v1alpha1), the Prometheus
Operator's ServiceMonitor (monitoring.coreos.com/v1) and the External Secrets Operator's
ExternalSecret (external-secrets.io/v1).

Each model holds the fields of its CRD that framefleet uses, with the CRD's names and types
(KEDA's trigger metadata is a map of strings, durations follow the operator's pattern), and
forbids any other field: a misspelt or misplaced key fails here as it would be pruned or
refused by the API server. Not modelled: fields framefleet does not use (a new one needs a
line here).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

DURATION = r"^(0|(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Metadata(Strict):
    name: StrictStr = Field(pattern=NAME)
    namespace: StrictStr = Field(pattern=NAME)
    labels: dict[StrictStr, StrictStr] = {}
    annotations: dict[StrictStr, StrictStr] = {}


class LabelSelector(Strict):
    matchLabels: dict[StrictStr, StrictStr]


# --- KEDA ---------------------------------------------------------------------------------------


class ScaleTargetRef(Strict):
    apiVersion: StrictStr | None = None
    kind: StrictStr | None = None
    name: StrictStr


class HpaConfig(Strict):
    name: StrictStr | None = None
    behavior: dict[StrictStr, Any] | None = None  # autoscaling/v2 behavior, checked below


class ScalingModifiers(Strict):
    formula: StrictStr
    target: StrictStr
    activationTarget: StrictStr | None = None
    metricType: Literal["AverageValue", "Value"] | None = None


class Advanced(Strict):
    restoreToOriginalReplicaCount: StrictBool | None = None
    horizontalPodAutoscalerConfig: HpaConfig | None = None
    scalingModifiers: ScalingModifiers | None = None


class AuthenticationRef(Strict):
    name: StrictStr
    kind: Literal["TriggerAuthentication", "ClusterTriggerAuthentication"] | None = None


class Trigger(Strict):
    type: StrictStr
    name: StrictStr | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    metadata: dict[StrictStr, StrictStr]
    authenticationRef: AuthenticationRef | None = None
    metricType: Literal["AverageValue", "Value", "Utilization"] | None = None
    useCachedMetrics: StrictBool | None = None


class ScaledObjectSpec(Strict):
    scaleTargetRef: ScaleTargetRef
    pollingInterval: StrictInt | None = Field(default=None, ge=1)
    cooldownPeriod: StrictInt | None = Field(default=None, ge=0)
    initialCooldownPeriod: StrictInt | None = Field(default=None, ge=0)
    idleReplicaCount: StrictInt | None = Field(default=None, ge=0)
    minReplicaCount: StrictInt | None = Field(default=None, ge=0)
    maxReplicaCount: StrictInt | None = Field(default=None, ge=1)
    advanced: Advanced | None = None
    triggers: list[Trigger] = Field(min_length=1)


class ScaledObject(Strict):
    apiVersion: Literal["keda.sh/v1alpha1"]
    kind: Literal["ScaledObject"]
    metadata: Metadata
    spec: ScaledObjectSpec


class SecretTargetRef(Strict):
    parameter: StrictStr
    name: StrictStr = Field(pattern=NAME)
    key: StrictStr


class TriggerAuthenticationSpec(Strict):
    secretTargetRef: list[SecretTargetRef] = Field(min_length=1)


class TriggerAuthentication(Strict):
    apiVersion: Literal["keda.sh/v1alpha1"]
    kind: Literal["TriggerAuthentication"]
    metadata: Metadata
    spec: TriggerAuthenticationSpec


# --- Prometheus Operator ------------------------------------------------------------------------


class RelabelConfig(Strict):
    sourceLabels: list[StrictStr] | None = None
    separator: StrictStr | None = None
    targetLabel: StrictStr | None = None
    regex: StrictStr | None = None
    replacement: StrictStr | None = None
    action: Literal[
        "replace", "keep", "drop", "hashmod", "labelmap", "labeldrop", "labelkeep",
        "lowercase", "uppercase", "keepequal", "dropequal",
    ] | None = None


class Endpoint(Strict):
    port: StrictStr
    path: StrictStr | None = Field(default=None, pattern=r"^/")
    scheme: Literal["http", "https"] | None = None
    interval: StrictStr | None = Field(default=None, pattern=DURATION)
    scrapeTimeout: StrictStr | None = Field(default=None, pattern=DURATION)
    honorLabels: StrictBool | None = None
    relabelings: list[RelabelConfig] | None = None
    metricRelabelings: list[RelabelConfig] | None = None


class ServiceMonitorSpec(Strict):
    selector: LabelSelector
    jobLabel: StrictStr | None = None
    endpoints: list[Endpoint] = Field(min_length=1)


class ServiceMonitor(Strict):
    apiVersion: Literal["monitoring.coreos.com/v1"]
    kind: Literal["ServiceMonitor"]
    metadata: Metadata
    spec: ServiceMonitorSpec


# --- External Secrets Operator ------------------------------------------------------------------


class SecretStoreRef(Strict):
    name: StrictStr
    kind: Literal["SecretStore", "ClusterSecretStore"]


class SecretTemplate(Strict):
    engineVersion: Literal["v2"]
    data: dict[StrictStr, StrictStr] = Field(min_length=1)


class ExternalSecretTarget(Strict):
    name: StrictStr = Field(pattern=NAME)
    creationPolicy: Literal["Owner", "Orphan", "Merge", "None"] | None = None
    template: SecretTemplate | None = None


class RemoteRef(Strict):
    key: StrictStr
    property: StrictStr | None = None


class ExternalSecretData(Strict):
    secretKey: StrictStr
    remoteRef: RemoteRef


class ExternalSecretSpec(Strict):
    refreshInterval: StrictStr | None = Field(default=None, pattern=DURATION)
    secretStoreRef: SecretStoreRef
    target: ExternalSecretTarget
    data: list[ExternalSecretData] = Field(min_length=1)


class ExternalSecret(Strict):
    apiVersion: Literal["external-secrets.io/v1"]
    kind: Literal["ExternalSecret"]
    metadata: Metadata
    spec: ExternalSecretSpec


MODELS: dict[str, type[BaseModel]] = {
    "ScaledObject": ScaledObject,
    "TriggerAuthentication": TriggerAuthentication,
    "ServiceMonitor": ServiceMonitor,
    "ExternalSecret": ExternalSecret,
}
