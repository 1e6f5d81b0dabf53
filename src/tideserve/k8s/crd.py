"""The ``inferenceendpoints.tideserve.io`` CustomResourceDefinition, generated from the pydantic spec.

``render_crd()`` returns the CRD as a plain dict. Its ``openAPIV3Schema`` is derived from
``InferenceEndpoint.model_json_schema(by_alias=True)`` by :func:`structural_schema`, so the
CRD and the spec cannot drift apart; ``deploy/kustomize/crd.yaml`` is its committed output
(a test compares the two).

Kubernetes accepts only *structural* schemas (kubernetes.io docs, "Extend the Kubernetes API
with CustomResourceDefinitions", section "Specifying a structural schema"): every node has a
``type``, no ``$ref``, ``anyOf`` may only add value validations, ``additionalProperties`` may
not sit next to ``properties``, and the schema dialect is OpenAPI 3.0 (``nullable``, boolean
``exclusiveMinimum``). The conversion below maps pydantic's JSON Schema onto those rules:

| pydantic JSON Schema | CRD schema |
| --- | --- |
| ``$ref`` to ``$defs`` | inlined |
| ``anyOf: [X, {type: null}]`` (``Optional``) | X with ``nullable: true`` |
| ``const: v`` | ``enum: [v]`` |
| ``exclusiveMinimum: n`` (number) | ``minimum: n`` + ``exclusiveMinimum: true`` |
| ``additionalProperties: false`` next to ``properties`` | dropped (the API server prunes unknown fields and ``kubectl`` warns on them) |
| ``title``, ``default: null`` | dropped |
"""

from __future__ import annotations

import copy
from typing import Any

from tideserve.k8s import names
from tideserve.spec.models import EndpointSpec

CRD_NAME = f"{names.PLURAL}.{names.GROUP}"

#: Keys a structural schema node may carry (the JSONSchemaProps fields the conversion emits).
_KEEP = {
    "type", "description", "properties", "items", "required", "enum", "pattern", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "minItems", "maxItems",
    "additionalProperties", "default", "nullable", "format", "uniqueItems",
}


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        if "$ref" in node:
            ref = node["$ref"]
            if not ref.startswith("#/$defs/"):
                raise ValueError(f"cannot inline $ref {ref!r}: only local #/$defs/ references are generated")
            merged = {**copy.deepcopy(defs[ref.removeprefix("#/$defs/")]), **{k: v for k, v in node.items() if k != "$ref"}}
            return _resolve(merged, defs)
        return {k: _resolve(v, defs) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(v, defs) for v in node]
    return node


def _convert(node: dict[str, Any]) -> dict[str, Any]:
    node = dict(node)
    any_of = node.pop("anyOf", None)
    if any_of is not None:
        non_null = [s for s in any_of if s.get("type") != "null"]
        if len(non_null) != 1:
            raise ValueError(f"anyOf with {len(non_null)} non-null branches has no structural form: {any_of}")
        nullable = len(non_null) < len(any_of)
        node = {**non_null[0], **node}
        if nullable:
            node["nullable"] = True
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if "enum" in node and "type" not in node:
        kinds = {type(v) for v in node["enum"]}
        if kinds == {str}:
            node["type"] = "string"
    for bound, flag in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(node.get(bound), (int, float)) and not isinstance(node.get(bound), bool):
            node[flag] = node.pop(bound)
            node[bound] = True
    if node.get("default", 0) is None:
        node.pop("default")
    if "properties" in node:
        node.pop("additionalProperties", None)
        node["properties"] = {k: _convert(v) for k, v in node["properties"].items()}
    elif isinstance(node.get("additionalProperties"), dict):
        node["additionalProperties"] = _convert(node["additionalProperties"])
    if isinstance(node.get("items"), dict):
        node["items"] = _convert(node["items"])
    out = {k: v for k, v in node.items() if k in _KEEP}
    if "type" not in out:
        raise ValueError(f"schema node without a type cannot be structural: {node}")
    return out


def structural_schema(json_schema: dict[str, Any]) -> dict[str, Any]:
    """A pydantic JSON Schema (with ``$defs``) as a Kubernetes structural OpenAPI v3 schema.

    Raises ValueError for a construct with no structural form (a union of two types, a
    non-local ``$ref``, a node without a type).
    """
    defs = json_schema.get("$defs", {})
    root = _resolve({k: v for k, v in json_schema.items() if k != "$defs"}, defs)
    return _convert(root)


def _spec_schema() -> dict[str, Any]:
    schema = structural_schema(EndpointSpec.model_json_schema(by_alias=True))
    pools = schema["properties"]["pools"]
    # Pools merge by name under server-side apply, and the API server refuses two of one name.
    pools["x-kubernetes-list-type"] = "map"
    pools["x-kubernetes-list-map-keys"] = ["name"]
    return schema


def _status_schema() -> dict[str, Any]:
    condition = {
        "type": "object",
        "required": ["type", "status"],
        "properties": {
            "type": {"type": "string", "description": "Ready or Degraded."},
            "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
            "reason": {"type": "string", "description": "CamelCase reason, e.g. RenderFailed."},
            "message": {"type": "string"},
            "lastTransitionTime": {"type": "string", "format": "date-time"},
            "observedGeneration": {"type": "integer"},
        },
    }
    pool = {
        "type": "object",
        "required": ["name"],
        "x-kubernetes-preserve-unknown-fields": True,
        "properties": {
            "name": {"type": "string"},
            "accelerator": {"type": "string"},
            "target": {"type": "string"},
            "replicas": {"type": "integer", "description": "Pods of the pool's Deployment."},
            "readyReplicas": {"type": "integer", "description": "Pods whose model is loaded."},
            "desiredReplicas": {"type": "integer", "description": "What the autoscaler asks for."},
        },
    }
    return {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
        "properties": {
            "observedGeneration": {"type": "integer"},
            "conditions": {
                "type": "array",
                "items": condition,
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
            },
            "pools": {
                "type": "array",
                "items": pool,
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
            },
            "address": {"type": "string", "description": "The gateway's load balancer hostname, once known."},
        },
    }


def endpoint_schema() -> dict[str, Any]:
    """The ``openAPIV3Schema`` of an InferenceEndpoint object (apiVersion, kind, metadata,
    spec, status). ``metadata`` is left to the API server (a CRD may not constrain it beyond
    name), ``spec`` is generated from :class:`~tideserve.spec.models.EndpointSpec`."""
    return {
        "type": "object",
        "description": "A model behind one entry point, served by pools of different accelerators (tideserve).",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": _spec_schema(),
            "status": _status_schema(),
        },
    }


def render_crd() -> dict[str, Any]:
    """The CustomResourceDefinition ``inferenceendpoints.tideserve.io`` (namespaced, v1alpha1,
    status subresource, printer columns) as a dict."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME, "labels": {names.LABEL_MANAGED_BY: names.FIELD_MANAGER}},
        "spec": {
            "group": names.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": names.KIND,
                "listKind": f"{names.KIND}List",
                "plural": names.PLURAL,
                "singular": names.KIND.lower(),
                "shortNames": ["ie", "tsie"],
                "categories": ["tideserve"],
            },
            "versions": [
                {
                    "name": names.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": endpoint_schema()},
                    "additionalPrinterColumns": [
                        {"name": "Model", "type": "string", "jsonPath": ".spec.model.name"},
                        {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
                        {"name": "Reason", "type": "string",
                         "jsonPath": '.status.conditions[?(@.type=="Degraded")].reason', "priority": 1},
                        {"name": "Address", "type": "string", "jsonPath": ".status.address", "priority": 1},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                }
            ],
        },
    }
