"""Validation helpers for rendered manifests: core kinds with kubernetes-validate (strict, one
shipped Kubernetes version), CRD-backed kinds against KEDA's and Karpenter's own CRD schemas (from
their Go modules at the versions `make test-k8s` runs, tests/upstream.py) or our own CRD,
Prometheus-operator kinds against its CRDs (same way) and structurally."""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from upstream import upstream_file

REPO = Path(__file__).resolve().parents[3]
K8S_VERSION = "1.33.0"

CRD_FILES = {
    ("keda.sh/v1alpha1", "ScaledObject"): "keda.sh_scaledobjects.yaml",
    ("karpenter.sh/v1", "NodePool"): "karpenter.sh_nodepools.yaml",
    ("karpenter.k8s.aws/v1", "EC2NodeClass"): "karpenter.k8s.aws_ec2nodeclasses.yaml",
    ("monitoring.coreos.com/v1", "PodMonitor"): "monitoring.coreos.com_podmonitors.yaml",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "monitoring.coreos.com_servicemonitors.yaml",
}


def openapi_to_jsonschema(node: Any) -> Any:
    """An OpenAPI v3.0 (CRD) schema as draft-4 JSON Schema: ``nullable`` becomes a null type;
    ``x-kubernetes-int-or-string`` an integer-or-string type; boolean exclusive bounds are
    already draft-4."""
    if isinstance(node, list):
        return [openapi_to_jsonschema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: openapi_to_jsonschema(v) for k, v in node.items() if k not in ("nullable",)}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("anyOf", None)
        out["type"] = ["integer", "string"]
    if node.get("nullable") and "type" in out:
        out["type"] = [*([out["type"]] if isinstance(out["type"], str) else out["type"]), "null"]
    if "properties" in node and isinstance(node["properties"], dict):
        out["properties"] = {k: openapi_to_jsonschema(v) for k, v in node["properties"].items()}
    return out


def crd_validator(crd: dict, version: str) -> jsonschema.Draft4Validator:
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            return jsonschema.Draft4Validator(openapi_to_jsonschema(copy.deepcopy(v["schema"]["openAPIV3Schema"])))
    raise KeyError(f"{crd['metadata']['name']} has no version {version}")


@cache
def upstream_validator(api_version: str, kind: str) -> jsonschema.Draft4Validator:
    crd = yaml.safe_load(upstream_file(CRD_FILES[(api_version, kind)]).read_text())
    return crd_validator(crd, api_version.split("/")[1])


def errors_of(validator: jsonschema.Draft4Validator, obj: dict) -> list[str]:
    return sorted(f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj))


def _monitor_errors(obj: dict) -> list[str]:
    """What the CRD schema cannot say about PodMonitor/ServiceMonitor: a selector and endpoints."""
    spec, errs = obj.get("spec", {}), []
    if not spec.get("selector", {}).get("matchLabels"):
        errs.append("spec.selector.matchLabels is empty")
    eps = spec.get("podMetricsEndpoints" if obj["kind"] == "PodMonitor" else "endpoints")
    if not eps:
        errs.append("no metrics endpoints")
    for e in eps or []:
        if not isinstance(e.get("port"), str) or not e.get("path", "").startswith("/"):
            errs.append(f"bad endpoint {e}")
    return errs


def validate(obj: dict) -> list[str]:
    """Problems of one rendered object (empty when valid)."""
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key[0] == "monitoring.coreos.com/v1" and key[1] in ("PodMonitor", "ServiceMonitor"):
        return errors_of(upstream_validator(*key), obj) + _monitor_errors(obj)
    if key in CRD_FILES:
        return errors_of(upstream_validator(*key), obj)
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'.'.join(map(str, exc.path))}: {exc.message}"]
    return []
