"""Cluster-level objects, rendered once per cluster (not per endpoint) from a small ClusterConfig.

``render_cluster(config)`` returns: the PriorityClasses (``tideserve-inference`` high, ``training``
low, so the scheduler preempts training pods for inference pods), one EC2NodeClass
(karpenter.k8s.aws/v1: AMI alias, subnet and security-group selectors), one Karpenter NodePool
(karpenter.sh/v1) per GPU family with a ``nvidia.com/gpu`` NoSchedule taint (only pods that
tolerate it, i.e. tideserve's GPU workers, land there), and the Grafana dashboard as a ConfigMap
(label ``grafana_dashboard: "1"``, the Grafana Helm chart's sidecar default) in the monitoring
namespace: the dashboard covers every endpoint, so it is one object per cluster.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import Field, model_validator

from tideserve.k8s import names
from tideserve.spec.models import _DNS_LABEL, CapacityType, _Strict

_QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|M|G|T)?$"


class NodeLimits(_Strict):
    """Most resources one NodePool may launch in total (Karpenter stops launching past them)."""

    cpu: str = Field("1000", pattern=_QUANTITY, description="vCPUs, a Kubernetes quantity.")
    memory: str = Field("4000Gi", pattern=_QUANTITY, description="Memory, a Kubernetes quantity.")
    gpus: int = Field(16, ge=0, description="nvidia.com/gpu devices.")


class DisruptionBudget(_Strict):
    """Karpenter disruption budget: at most ``nodes`` (count or percentage) disrupted at once,
    optionally only during a cron ``schedule`` window of ``duration``."""

    nodes: str = Field("10%", pattern=r"^((100|[0-9]{1,2})%|[0-9]+)$")
    schedule: str | None = Field(
        None, pattern=r"^(@(annually|yearly|monthly|weekly|daily|midnight|hourly)|\S+(\s+\S+){4})$",
        description="Cron schedule the budget applies in (UTC): five fields (e.g. '0 8 * * mon-fri') or "
                    "@daily, @hourly, ... (what Karpenter's NodePool CRD accepts for budgets[].schedule).")
    duration: str | None = Field(None, pattern=r"^([0-9]+(s|m|h))+$", description="Window length, e.g. 8h.")
    reasons: list[Literal["Underutilized", "Empty", "Drifted"]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _schedule_with_duration(self) -> DisruptionBudget:
        if (self.schedule is None) != (self.duration is None):
            raise ValueError("set schedule and duration together, or neither")
        return self


Architecture = Literal["amd64", "arm64"]
_SPOT_FIRST: tuple[CapacityType, ...] = ("spot", "on-demand")
_AMD64: tuple[Architecture, ...] = ("amd64",)


class GpuFamily(_Strict):
    """One NodePool: instances with the given GPUs (``gpu_names``, Karpenter's
    ``karpenter.k8s.aws/instance-gpu-name``, e.g. a10g, l40s) and/or instance families (g5, g6e)."""

    name: str = Field(pattern=_DNS_LABEL, description="NodePool name suffix: tideserve-<name>.")
    gpu_names: list[str] = Field(default_factory=list)
    instance_families: list[str] = Field(default_factory=list)
    capacity_types: list[CapacityType] = Field(default_factory=lambda: list(_SPOT_FIRST), min_length=1)
    architectures: list[Architecture] = Field(default_factory=lambda: list(_AMD64), min_length=1)
    limits: NodeLimits = Field(default_factory=NodeLimits)
    consolidation_policy: Literal["WhenEmpty", "WhenEmptyOrUnderutilized"] = Field(
        "WhenEmpty", description="WhenEmpty: only empty nodes are removed (no model reload elsewhere).")
    consolidate_after_s: int = Field(300, ge=0, description="Seconds a node stays empty/underused before removal.")
    expire_after_h: int | None = Field(720, ge=1, description="Replace nodes after this many hours; None: never.")
    budgets: list[DisruptionBudget] = Field(default_factory=lambda: [DisruptionBudget()])
    weight: int | None = Field(None, ge=1, le=100, description="Karpenter prefers NodePools of higher weight.")

    @model_validator(mode="after")
    def _selects_something(self) -> GpuFamily:
        if not self.gpu_names and not self.instance_families:
            raise ValueError(f"GPU family '{self.name}' selects no instances; set gpu_names and/or instance_families")
        return self


class ClusterConfig(_Strict):
    """The cluster facts Karpenter needs (see examples/cluster.yaml)."""

    cluster_name: str = Field(description="EKS cluster name.")
    node_role: str = Field(description="IAM role name of the nodes Karpenter launches.")
    ami_alias: str = Field("al2023@latest", pattern=r"^(al2023|al2|bottlerocket|windows2019|windows2022)@.+$",
                           description="EC2NodeClass AMI alias; AL2023 and Bottlerocket pick their NVIDIA variant for GPU types.")
    subnet_selector_tags: dict[str, str] = Field(min_length=1)
    security_group_selector_tags: dict[str, str] = Field(min_length=1)
    node_class_name: str = Field("tideserve-gpu", pattern=_DNS_LABEL)
    root_volume_size: str = Field("200Gi", pattern=_QUANTITY, description="Root EBS volume (images, model cache).")
    gpu_families: list[GpuFamily] = Field(min_length=1)
    inference_priority: int = Field(1_000_000, ge=1, le=1_000_000_000)
    training_priority: int = Field(1_000, ge=0, le=1_000_000_000)
    monitoring_namespace: str = Field("monitoring", pattern=_DNS_LABEL)
    grafana_datasource_uid: str = Field("prometheus", description="UID of Grafana's Prometheus data source.")

    @model_validator(mode="after")
    def _priorities(self) -> ClusterConfig:
        if self.training_priority >= self.inference_priority:
            raise ValueError("training_priority must be below inference_priority so that inference preempts training")
        names_ = [f.name for f in self.gpu_families]
        dupes = sorted({n for n in names_ if names_.count(n) > 1})
        if dupes:
            raise ValueError(f"GPU family names must be unique; repeated: {', '.join(dupes)}")
        return self


def _labels() -> dict[str, str]:
    return {names.LABEL_NAME: "tideserve", names.LABEL_MANAGED_BY: names.FIELD_MANAGER}


def priority_classes(config: ClusterConfig) -> list[dict]:
    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": names.PRIORITY_CLASS_INFERENCE, "labels": _labels()},
            "value": config.inference_priority,
            "globalDefault": False,
            "preemptionPolicy": "PreemptLowerPriority",
            "description": "tideserve inference pods; preempt training pods when GPUs are short.",
        },
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": names.PRIORITY_CLASS_TRAINING, "labels": _labels()},
            "value": config.training_priority,
            "globalDefault": False,
            "preemptionPolicy": "Never",
            "description": "Training jobs sharing the cluster: preempted by inference, never preempt others.",
        },
    ]


def node_class(config: ClusterConfig) -> dict:
    return {
        "apiVersion": "karpenter.k8s.aws/v1",
        "kind": "EC2NodeClass",
        "metadata": {"name": config.node_class_name, "labels": _labels()},
        "spec": {
            "role": config.node_role,
            "amiSelectorTerms": [{"alias": config.ami_alias}],
            "subnetSelectorTerms": [{"tags": dict(sorted(config.subnet_selector_tags.items()))}],
            "securityGroupSelectorTerms": [{"tags": dict(sorted(config.security_group_selector_tags.items()))}],
            "blockDeviceMappings": [{
                "deviceName": "/dev/xvda",
                "ebs": {"volumeSize": config.root_volume_size, "volumeType": "gp3", "encrypted": True,
                        "deleteOnTermination": True},
            }],
            "metadataOptions": {"httpEndpoint": "enabled", "httpTokens": "required", "httpPutResponseHopLimit": 1},
            "tags": {"tideserve.io/cluster": config.cluster_name},
        },
    }


def node_pool(config: ClusterConfig, family: GpuFamily) -> dict:
    requirements = []
    if family.gpu_names:
        requirements.append({"key": "karpenter.k8s.aws/instance-gpu-name", "operator": "In", "values": sorted(family.gpu_names)})
    if family.instance_families:
        requirements.append({"key": "karpenter.k8s.aws/instance-family", "operator": "In",
                             "values": sorted(family.instance_families)})
    requirements += [
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": sorted(set(family.capacity_types))},
        {"key": "kubernetes.io/arch", "operator": "In", "values": sorted(set(family.architectures))},
    ]
    template_spec: dict = {
        "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": config.node_class_name},
        "requirements": requirements,
        "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
        "expireAfter": f"{family.expire_after_h}h" if family.expire_after_h else "Never",
    }
    budgets = []
    for b in family.budgets:
        entry: dict = {"nodes": b.nodes}
        if b.schedule:
            entry["schedule"], entry["duration"] = b.schedule, b.duration
        if b.reasons:
            entry["reasons"] = list(b.reasons)
        budgets.append(entry)
    spec: dict = {
        "template": {"metadata": {"labels": {"tideserve.io/gpu-family": family.name}}, "spec": template_spec},
        "limits": {"cpu": family.limits.cpu, "memory": family.limits.memory, "nvidia.com/gpu": family.limits.gpus},
        "disruption": {"consolidationPolicy": family.consolidation_policy,
                       "consolidateAfter": f"{family.consolidate_after_s}s", "budgets": budgets},
    }
    if family.weight is not None:
        spec["weight"] = family.weight
    return {"apiVersion": "karpenter.sh/v1", "kind": "NodePool",
            "metadata": {"name": f"tideserve-{family.name}", "labels": _labels()}, "spec": spec}


def dashboard_config_map(config: ClusterConfig) -> dict:
    from tideserve.metrics.dashboard import build_dashboard

    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "tideserve-dashboard", "namespace": config.monitoring_namespace,
                     "labels": {**_labels(), "grafana_dashboard": "1"}},
        "data": {"tideserve-dashboard.json": json.dumps(build_dashboard(config.grafana_datasource_uid), indent=2,
                                                        sort_keys=True) + "\n"},
    }


def render_cluster(config: ClusterConfig) -> list[dict]:
    """PriorityClasses, the EC2NodeClass, one NodePool per GPU family (sorted by name), the
    dashboard ConfigMap; deterministic."""
    return [
        *priority_classes(config),
        node_class(config),
        *[node_pool(config, f) for f in sorted(config.gpu_families, key=lambda f: f.name)],
        dashboard_config_map(config),
    ]
