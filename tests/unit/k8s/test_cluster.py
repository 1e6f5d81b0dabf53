"""render_cluster: Karpenter NodePools/EC2NodeClass valid against their CRDs, PriorityClasses,
dashboard ConfigMap; and the install base (kustomize) is the committed one."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from manifest_checks import REPO, validate
from tideserve.errors import SpecError
from tideserve.k8s.cluster import ClusterConfig, render_cluster
from tideserve.k8s.crd import render_crd
from tideserve.k8s.install import cluster_role, helm_chart_files, install_objects, kustomize_files
from tideserve.metrics.dashboard import build_dashboard
from tideserve.spec.load import load_model_text

CLUSTER = REPO / "examples" / "cluster.yaml"


def config() -> ClusterConfig:
    return load_model_text(ClusterConfig, CLUSTER.read_text(), str(CLUSTER))


def test_every_cluster_object_validates():
    objs = render_cluster(config())
    assert [(o["kind"], o["metadata"]["name"]) for o in objs] == [
        ("PriorityClass", "tideserve-inference"), ("PriorityClass", "training"), ("EC2NodeClass", "tideserve-gpu"),
        ("NodePool", "tideserve-a10g"), ("NodePool", "tideserve-l40s"), ("ConfigMap", "tideserve-dashboard")]
    assert {f"{o['kind']}/{o['metadata']['name']}": validate(o) for o in objs if validate(o)} == {}


def test_node_pools_by_value():
    objs = render_cluster(config())
    a10g = next(o for o in objs if o["metadata"]["name"] == "tideserve-a10g")["spec"]
    assert a10g["template"]["spec"]["requirements"] == [
        {"key": "karpenter.k8s.aws/instance-gpu-name", "operator": "In", "values": ["a10g"]},
        {"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["g5"]},
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand", "spot"]},
        {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]
    assert a10g["template"]["spec"]["taints"] == [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    assert a10g["limits"] == {"cpu": "256", "memory": "1024Gi", "nvidia.com/gpu": 16}
    assert a10g["disruption"] == {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "300s", "budgets": [
        {"nodes": "20%"}, {"nodes": "0", "schedule": "0 8 * * mon-fri", "duration": "10h"}]}
    nc = next(o for o in objs if o["kind"] == "EC2NodeClass")["spec"]
    assert nc["amiSelectorTerms"] == [{"alias": "al2023@latest"}]
    assert nc["subnetSelectorTerms"] == [{"tags": {"karpenter.sh/discovery": "ml-prod"}}]
    assert nc["role"] == "KarpenterNodeRole-ml-prod"


def test_inference_preempts_training():
    pcs = {o["metadata"]["name"]: o for o in render_cluster(config()) if o["kind"] == "PriorityClass"}
    assert pcs["tideserve-inference"]["value"] > pcs["training"]["value"]
    assert pcs["tideserve-inference"]["preemptionPolicy"] == "PreemptLowerPriority"
    with pytest.raises(SpecError, match="training_priority must be below inference_priority"):
        load_model_text(ClusterConfig, CLUSTER.read_text() + "training_priority: 2000000\n")


def test_dashboard_config_map():
    cm = render_cluster(config())[-1]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "monitoring"
    assert json.loads(cm["data"]["tideserve-dashboard.json"]) == build_dashboard("prometheus")


def test_a_family_that_selects_nothing_is_refused():
    text = CLUSTER.read_text().replace("    gpu_names: [l40s]\n    instance_families: [g6e]\n", "")
    with pytest.raises(SpecError, match="selects no instances; set gpu_names and/or instance_families"):
        load_model_text(ClusterConfig, text)


def test_install_objects_validate_and_rbac_is_least_privilege():
    files = kustomize_files()
    for name in ("crd.yaml", "namespace.yaml", "rbac.yaml", "operator.yaml"):
        for o in yaml.safe_load_all(files[name]):
            assert validate(o) == [], (name, o["kind"])
    rules = {(g, r): set(rule["verbs"]) for rule in cluster_role()["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert rules[("tideserve.io", "inferenceendpoints/status")] == {"get", "patch"}
    assert rules[("", "pods")] == {"get", "list", "watch", "patch"}  # no create/delete of pods
    assert rules[("", "secrets")] == {"create"}  # created once; never read back, listed, rewritten or deleted by us
    assert all("*" not in verbs and "escalate" not in verbs and "bind" not in verbs for verbs in rules.values())
    # every kind render_endpoint emits can be server-side applied and deleted
    for key in [("", "configmaps"), ("", "services"), ("", "persistentvolumes"), ("", "persistentvolumeclaims"),
                ("apps", "deployments"), ("policy", "poddisruptionbudgets"), ("keda.sh", "scaledobjects"),
                ("monitoring.coreos.com", "podmonitors"), ("monitoring.coreos.com", "servicemonitors")]:
        assert {"get", "create", "patch", "delete"} <= rules[key], key


def test_committed_kustomize_base_is_the_generated_one():
    """Regenerate with: TIDESERVE_UPDATE_GOLDEN=1 pytest tests/unit/k8s"""
    base = REPO / "deploy" / "kustomize"
    files = kustomize_files()
    if os.environ.get("TIDESERVE_UPDATE_GOLDEN"):
        for name, text in files.items():
            (base / name).write_text(text)
    assert {p.name: p.read_text() for p in base.iterdir()} == files


@pytest.mark.parametrize("schedule, ok", [("0 8 * * mon-fri", True), ("@daily", True), ("*/5  0 1 1 *", True),
                                          ("every day", False), ("0 8 * *", False), ("@sometimes", False)])
def test_a_budget_schedule_must_be_cron(schedule, ok):
    # Before: "every day" rendered into the NodePool, which Karpenter's CRD refuses at apply time.
    text = CLUSTER.read_text().replace('schedule: "0 8 * * mon-fri"', f'schedule: "{schedule}"')
    assert f'schedule: "{schedule}"' in text
    if ok:
        budgets = load_model_text(ClusterConfig, text).gpu_families[0].budgets
        assert budgets[1].schedule == schedule
    else:
        with pytest.raises(SpecError, match=r"gpu_families\[0\]\.budgets\[1\]\.schedule"):
            load_model_text(ClusterConfig, text)


def test_committed_helm_chart_is_the_generated_one():
    """Regenerate with: TIDESERVE_UPDATE_GOLDEN=1 pytest tests/unit/k8s"""
    base = REPO / "deploy" / "helm" / "tideserve"
    files = helm_chart_files()
    if os.environ.get("TIDESERVE_UPDATE_GOLDEN"):
        for name, text in files.items():
            (base / name).parent.mkdir(parents=True, exist_ok=True)
            (base / name).write_text(text)
    assert {str(p.relative_to(base)): p.read_text() for p in base.rglob("*") if p.is_file()} == files


def test_helm_chart_holds_the_kustomize_objects():
    """The chart's templates, with its two expressions substituted as Helm would (a render by the
    real helm binary is in tests/k8s), are the kustomize base's objects but the Namespace."""
    files = helm_chart_files()
    text = "".join(files[f] for f in ("templates/rbac.yaml", "templates/operator.yaml"))
    text = text.replace('"{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"',
                        "registry.example/tideserve:9.9").replace("{{ .Release.Namespace }}", "ops")
    assert "{{" not in text
    assert [o for o in yaml.safe_load_all(text) if o] == install_objects("registry.example/tideserve:9.9", "ops")[1:]
    assert list(yaml.safe_load_all(files["crds/inferenceendpoints.yaml"])) == [render_crd()]
