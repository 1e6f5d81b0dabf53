"""The CRD is generated from the pydantic spec, structural, committed, and accepts the examples."""

from __future__ import annotations

import copy

import pytest
import yaml

from manifest_checks import REPO, crd_validator, errors_of, validate
from tideserve.k8s.crd import render_crd, structural_schema
from tideserve.k8s.render import to_yaml

EXAMPLES = sorted(p for p in (REPO / "examples").glob("*.yaml") if p.name != "cluster.yaml")


def _validator():
    return crd_validator(render_crd(), "v1alpha1")


def _walk(node, path="$"):
    yield path, node
    if isinstance(node, dict):
        for k, v in node.get("properties", {}).items():
            yield from _walk(v, f"{path}.{k}")
        if isinstance(node.get("items"), dict):
            yield from _walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            yield from _walk(node["additionalProperties"], f"{path}{{}}")


def test_schema_is_structural():
    schema = render_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    text = yaml.safe_dump(schema)
    for word in ("$ref", "$defs", "anyOf", "const", "title"):
        assert word not in text, word
    for path, node in _walk(schema):
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), path
        assert not ("properties" in node and "additionalProperties" in node), path
        for bound in ("exclusiveMinimum", "exclusiveMaximum"):
            assert isinstance(node.get(bound, True), bool), (path, bound)


def test_schema_is_generated_from_the_spec_by_value():
    spec = render_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    pool = spec["properties"]["pools"]["items"]["properties"]
    assert pool["accelerator"]["enum"] == ["cpu", "a10g", "l4", "l40s", "a100", "h100", "h200"]
    assert pool["capacity_types"]["items"]["enum"] == ["on-demand", "spot"]
    assert spec["properties"]["pools"]["x-kubernetes-list-map-keys"] == ["name"]
    decoding = spec["properties"]["model"]["properties"]["decoding"]["properties"]
    assert decoding["language"] == {"type": "string", "nullable": True,
                                    "description": "Force a language code (multilingual models); None detects it."}
    assert decoding["max_new_tokens"]["maximum"] == 440 and decoding["max_new_tokens"]["nullable"] is True
    timeout = spec["properties"]["gateway"]["properties"]["request_timeout_s"]
    assert (timeout["minimum"], timeout["exclusiveMinimum"], timeout["default"]) == (0, True, 300)
    assert spec["properties"]["model"]["properties"]["task"]["enum"] == ["transcription"]
    assert spec["required"] == ["model", "pools"]


def test_conversion_rules():
    js = {"$defs": {"B": {"type": "object", "additionalProperties": False, "properties": {"x": {"const": "a"}}}},
          "type": "object", "title": "T",
          "properties": {"b": {"$ref": "#/$defs/B"}, "m": {"type": "object", "additionalProperties": {"type": "integer"}},
                         "o": {"anyOf": [{"type": "number", "exclusiveMinimum": 0}, {"type": "null"}], "default": None}}}
    assert structural_schema(js) == {
        "type": "object",
        "properties": {"b": {"type": "object", "properties": {"x": {"type": "string", "enum": ["a"]}}},
                       "m": {"type": "object", "additionalProperties": {"type": "integer"}},
                       "o": {"type": "number", "minimum": 0, "exclusiveMinimum": True, "nullable": True}},
    }
    with pytest.raises(ValueError, match="non-null branches"):
        structural_schema({"anyOf": [{"type": "string"}, {"type": "integer"}]})


def test_crd_is_a_valid_kubernetes_object():
    crd = render_crd()
    assert validate(crd) == []
    v = crd["spec"]["versions"][0]
    assert (crd["metadata"]["name"], crd["spec"]["scope"], v["name"]) == ("inferenceendpoints.tideserve.io", "Namespaced", "v1alpha1")
    assert v["subresources"] == {"status": {}}
    status = v["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert {"conditions", "pools", "observedGeneration"} <= set(status)
    assert [c["name"] for c in v["additionalPrinterColumns"]] == ["Model", "Ready", "Reason", "Address", "Age"]


def test_committed_crd_is_the_generated_one():
    committed = (REPO / "deploy" / "kustomize" / "crd.yaml").read_text()
    assert list(yaml.safe_load_all(committed)) == [render_crd()], (
        "deploy/kustomize/crd.yaml is stale; regenerate: TIDESERVE_UPDATE_GOLDEN=1 pytest tests/unit/k8s")
    assert committed.endswith(to_yaml([render_crd()]))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate_against_the_crd(example):
    assert errors_of(_validator(), yaml.safe_load(example.read_text())) == []


def test_a_broken_example_fails_with_its_path():
    doc = yaml.safe_load((REPO / "examples" / "whisper-a10g-l40s.yaml").read_text())
    bad = copy.deepcopy(doc)
    bad["spec"]["pools"][1]["accelerator"] = "b200"
    bad["spec"]["pools"][0]["replicas"]["max"] = 0
    bad["spec"]["gateway"]["request_timeout_s"] = 0
    errs = errors_of(_validator(), bad)
    assert len(errs) == 3
    assert errs[0].startswith("spec.gateway.request_timeout_s: 0 is less than or equal to the minimum of 0")
    assert errs[1].startswith("spec.pools.0.replicas.max: 0 is less than the minimum of 1")
    assert errs[2].startswith("spec.pools.1.accelerator: 'b200' is not one of")
    missing = copy.deepcopy(doc)
    del missing["spec"]["model"]["source"]
    assert errors_of(_validator(), missing) == ["spec.model: 'source' is a required property"]
