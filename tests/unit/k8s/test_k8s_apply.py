"""The applier (tideserve.k8s.apply) against a kmock API server, and its pure helpers; the
operator's condition builder."""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

import kmock
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from kube_mock import APPLY_CONTENT_TYPE, mock_server, write_kubeconfig

from tideserve.k8s import names
from tideserve.k8s.apply import (
    ApplyError, Cluster, ObjectRef, Owner, apply_endpoint, decorate, delete_cluster_scoped, token_secret,
)
from tideserve.k8s.operator import KopfRecordFilter, Observation, assess, conditions, endpoint_document
from tideserve.logs import JsonFormatter

OWNER = Owner(name="whisper", namespace="prod", uid="u-1")
LABELS = {names.LABEL_ENDPOINT: "whisper", names.LABEL_MANAGED_BY: "tideserve"}


def dep(name: str, **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, **meta}, "spec": {"replicas": 1}}


# -- pure helpers ---------------------------------------------------------------------------------

def test_decorate_namespaced_adds_labels_namespace_and_owner_reference() -> None:
    src = dep("whisper-cpu", labels={names.LABEL_POOL: "cpu"})
    out = decorate(src, OWNER, namespaced=True)
    assert out["metadata"] == {
        "name": "whisper-cpu", "namespace": "prod", "labels": {names.LABEL_POOL: "cpu", **LABELS},
        "ownerReferences": [{"apiVersion": "tideserve.io/v1alpha1", "kind": "InferenceEndpoint", "name": "whisper",
                             "uid": "u-1", "controller": True, "blockOwnerDeletion": True}],
    }
    assert src["metadata"] == {"name": "whisper-cpu", "labels": {names.LABEL_POOL: "cpu"}}  # not mutated
    assert decorate(out, OWNER, namespaced=True) == out  # idempotent: one owner reference


def test_decorate_cluster_scoped_has_labels_only() -> None:
    out = decorate({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                    "metadata": {"name": "p", "namespace": "x"}, "value": 1}, OWNER, namespaced=False)
    assert out["metadata"] == {"name": "p", "labels": LABELS}


@pytest.mark.parametrize("obj, words", [
    (dep("a", namespace="other"), "rendered into namespace 'other' but endpoint 'whisper' lives in 'prod'"),
    ({"apiVersion": "v1", "metadata": {"name": "a"}}, "has no kind"),
    ({"kind": "Service", "metadata": {"name": "a"}}, "has no apiVersion"),
    ({"apiVersion": "v1", "kind": "Service", "metadata": {}}, "a rendered Service has no metadata.name"),
    (["not", "a", "mapping"], "is a list, not a mapping"),
])
def test_decorate_refuses_bad_objects(obj: Any, words: str) -> None:
    with pytest.raises(ApplyError, match=words.replace("(", r"\(").replace(")", r"\)")) as info:
        decorate(obj, OWNER, namespaced=True)
    assert not info.value.retryable


def test_token_secret_is_random_url_safe_and_owned() -> None:
    a, b = token_secret(OWNER), token_secret(OWNER)
    assert a["metadata"]["name"] == "whisper-worker-token" and a["metadata"]["namespace"] == "prod"
    assert a["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    tok = base64.b64decode(a["data"]["token"]).decode()
    assert len(tok) == 43 and set(tok) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    assert a["data"] != b["data"]
    assert base64.b64decode(token_secret(OWNER, "fixed")["data"]["token"]) == b"fixed"


def test_conditions_keep_transition_time_while_status_holds() -> None:
    t0 = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)
    t1 = t0 + datetime.timedelta(minutes=5)
    first = conditions(ready=True, reason="Available", message="all ready", degraded=False, now=t0, previous=None)
    assert first == [
        {"type": "Ready", "status": "True", "reason": "Available", "message": "all ready",
         "lastTransitionTime": "2026-01-01T12:00:00Z"},
        {"type": "Degraded", "status": "False", "reason": "AsExpected", "message": "",
         "lastTransitionTime": "2026-01-01T12:00:00Z"},
    ]
    again = conditions(ready=True, reason="Available", message="still", degraded=False, now=t1, previous=first)
    assert [c["lastTransitionTime"] for c in again] == ["2026-01-01T12:00:00Z"] * 2
    broken = conditions(ready=False, reason="RenderFailed", message="boom", degraded=True, now=t1, previous=again)
    assert broken == [
        {"type": "Ready", "status": "False", "reason": "RenderFailed", "message": "boom",
         "lastTransitionTime": "2026-01-01T12:05:00Z"},
        {"type": "Degraded", "status": "True", "reason": "RenderFailed", "message": "boom",
         "lastTransitionTime": "2026-01-01T12:05:00Z"},
    ]
    waiting = conditions(ready=False, reason="Progressing", message="w", degraded=False, now=t1, previous=first)
    assert [(c["status"], c["reason"], c["lastTransitionTime"]) for c in waiting] == [
        ("False", "Progressing", "2026-01-01T12:05:00Z"), ("False", "AsExpected", "2026-01-01T12:00:00Z")]


POOLS = [{"name": "a10g", "accelerator": "a10g", "target": "cuda-sm86-fp16", "replicas": {"min": 1, "max": 4}},
         {"name": "cpu", "accelerator": "cpu", "target": "cpu-x86_64-int8", "replicas": {"min": 0, "max": 2}}]


def _deployment(ready: int, replicas: int, desired: int) -> dict[str, Any]:
    return {"spec": {"replicas": desired}, "status": {"replicas": replicas, "readyReplicas": ready}}


def test_assess_ready_when_gateway_up_and_pools_at_minimum() -> None:
    svc = {"status": {"loadBalancer": {"ingress": [{"ip": "10.0.0.7"}]}}}
    obs = assess(POOLS, _deployment(1, 1, 1), {"a10g": _deployment(1, 2, 2), "cpu": {"spec": {"replicas": 0}}}, svc)
    assert obs == Observation(True, "gateway 1 ready; pools: a10g 1 ready (min 1), cpu 0 ready (min 0)", [
        {"name": "a10g", "accelerator": "a10g", "target": "cuda-sm86-fp16", "replicas": 2, "readyReplicas": 1,
         "desiredReplicas": 2},
        {"name": "cpu", "accelerator": "cpu", "target": "cpu-x86_64-int8", "replicas": 0, "readyReplicas": 0,
         "desiredReplicas": 0}], "10.0.0.7")


def test_assess_names_everything_it_waits_for() -> None:
    obs = assess(POOLS, _deployment(0, 1, 1), {"a10g": _deployment(0, 1, 1), "cpu": None}, None)
    assert not obs.ready and obs.address is None
    assert obs.message == ("waiting for: gateway 0 ready; pool a10g: 0 ready < minimum 1; "
                           "pool cpu: Deployment missing")
    assert assess(POOLS[1:], None, {"cpu": _deployment(0, 0, 0)}, None).message == \
        "waiting for: gateway Deployment missing"


def test_endpoint_document_keeps_only_what_the_spec_describes() -> None:
    body = {"apiVersion": "tideserve.io/v1alpha1", "kind": "InferenceEndpoint",
            "metadata": {"name": "w", "namespace": "n", "uid": "u", "labels": {"team": "a"},
                         "annotations": {"x": "y"}, "generation": 3},
            "spec": {"pools": []}, "status": {"conditions": []}}
    assert endpoint_document(body) == {"apiVersion": "tideserve.io/v1alpha1", "kind": "InferenceEndpoint",
                                       "metadata": {"name": "w", "labels": {"team": "a"}}, "spec": {"pools": []}}


def test_kopf_record_filter_keeps_the_object_not_the_settings() -> None:
    record = logging.makeLogRecord({"name": "kopf.objects", "msg": "Handler succeeded.", "levelno": 20,
                                    "levelname": "INFO", "settings": object(), "k8s_skip": False,
                                    "k8s_ref": {"namespace": "prod", "name": "whisper", "uid": "u"}})
    assert KopfRecordFilter().filter(record)
    line = json.loads(JsonFormatter("operator").format(record))
    assert {k: line[k] for k in ("logger", "msg", "object")} == {
        "logger": "kopf.objects", "msg": "Handler succeeded.", "object": "prod/whisper"}
    assert not {"settings", "k8s_skip", "k8s_ref"} & set(line)


# -- against the API mock -------------------------------------------------------------------------

def run(coro: Any) -> None:
    asyncio.run(asyncio.wait_for(coro, 240))  # a safety net under pytest's 300 s, not a speed bound


def test_apply_prune_token_and_cluster_scoped_cleanup(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with mock_server() as mock:
            cluster = Cluster.connect(write_kubeconfig(tmp_path / "kc", str(mock.url).rstrip("/")))
            conn = cluster.connection()
            assert (conn.server, conn.scheme, conn.token) == (str(mock.url).rstrip("/"), "Bearer", "mock-token")
            # A Deployment with the endpoint label but not managed by tideserve is never pruned.
            await mock.post("/apis/apps/v1/namespaces/prod/deployments",
                            json=dep("hand-made", namespace="prod", labels={names.LABEL_ENDPOINT: "whisper"}))
            pc = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "whisper-pc"}, "value": 5}
            first = [dep("whisper-a"), dep("whisper-b"), pc]
            r1 = await asyncio.to_thread(apply_endpoint, cluster, OWNER, first)
            assert r1.applied == [ObjectRef("apps/v1", "Deployment", "prod", "whisper-a"),
                                  ObjectRef("apps/v1", "Deployment", "prod", "whisper-b"),
                                  ObjectRef("scheduling.k8s.io/v1", "PriorityClass", None, "whisper-pc")]
            assert r1.token_created and r1.pruned == []
            assert r1.kinds == ["apps/v1/Deployment", "scheduling.k8s.io/v1/PriorityClass"]
            ssa = [r for r in mock if r.method == "PATCH"]
            ssa_params = {"fieldManager": "tideserve", "force": "true"}
            assert [(r.url.path, r.params, r.headers["Content-Type"]) for r in ssa] == [
                ("/apis/apps/v1/namespaces/prod/deployments/whisper-a", ssa_params, APPLY_CONTENT_TYPE),
                ("/apis/apps/v1/namespaces/prod/deployments/whisper-b", ssa_params, APPLY_CONTENT_TYPE),
                ("/apis/scheduling.k8s.io/v1/priorityclasses/whisper-pc", ssa_params, APPLY_CONTENT_TYPE),
            ]
            token = mock.objects["v1/secrets", "prod", "whisper-worker-token"]["data"]["token"]

            # b and the PriorityClass kind are gone from the render: pruned (the kind through previous_kinds).
            # A rendered token Secret is skipped: re-applying never rotates the token.
            rendered_token = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "whisper-worker-token"},
                              "data": {"token": "cm90YXRlZA=="}}
            r2 = await asyncio.to_thread(apply_endpoint, cluster, OWNER, [dep("whisper-a"), rendered_token], r1.kinds)
            assert r2.applied == [ObjectRef("apps/v1", "Deployment", "prod", "whisper-a")]
            assert sorted(r2.pruned) == [ObjectRef("apps/v1", "Deployment", "prod", "whisper-b"),
                                         ObjectRef("scheduling.k8s.io/v1", "PriorityClass", None, "whisper-pc")]
            assert not r2.token_created
            assert mock.objects["v1/secrets", "prod", "whisper-worker-token"]["data"]["token"] == token
            assert not mock.objects["apps/v1/deployments", "prod", "hand-made"].deleted
            assert mock.objects["apps/v1/deployments", "prod", "whisper-b"].deleted

            # Cluster-scoped leftovers are deleted by label; namespaced kinds are left to the GC.
            await asyncio.to_thread(apply_endpoint, cluster, OWNER, [dep("whisper-a"), pc], r2.kinds)
            gone = await asyncio.to_thread(delete_cluster_scoped, cluster, OWNER,
                                           ["apps/v1/Deployment", "scheduling.k8s.io/v1/PriorityClass"])
            assert gone == [ObjectRef("scheduling.k8s.io/v1", "PriorityClass", None, "whisper-pc")]
            assert not mock.objects["apps/v1/deployments", "prod", "whisper-a"].deleted
            cluster.close()

    run(scenario())


def test_unserved_kind_and_unreachable_server_are_retryable(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with mock_server() as mock:
            cluster = Cluster.connect(write_kubeconfig(tmp_path / "kc", str(mock.url).rstrip("/")))
            widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
            with pytest.raises(ApplyError, match=r"does not serve Widget \(example.com/v1\)") as info:
                await asyncio.to_thread(apply_endpoint, cluster, OWNER, [widget])
            assert info.value.retryable and info.value.status == 404
            assert not [r for r in mock if r.method in ("PATCH", "POST")]  # nothing half-applied
            cluster.close()
        dead = Cluster.connect(write_kubeconfig(tmp_path / "kc2", "http://127.0.0.1:9"))
        with pytest.raises(ApplyError, match=re.escape("cannot reach the API server at http://127.0.0.1:9")) as info:
            await asyncio.to_thread(apply_endpoint, dead, OWNER, [dep("whisper-a")])
        assert info.value.retryable and info.value.status == 0

    run(scenario())


def test_rejected_object_is_not_retryable(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with mock_server() as mock:
            mock["patch /apis/apps/v1/namespaces/prod/deployments/whisper-a"] << kmock.KubernetesError(
                status=422, reason="Invalid", message="Deployment.apps \"whisper-a\" is invalid: spec.replicas: -1")
            cluster = Cluster.connect(write_kubeconfig(tmp_path / "kc", str(mock.url).rstrip("/")))
            with pytest.raises(ApplyError) as info:
                await asyncio.to_thread(apply_endpoint, cluster, OWNER, [dep("whisper-a")])
            assert str(info.value) == ('apply Deployment prod/whisper-a: HTTP 422: '
                                       'Deployment.apps "whisper-a" is invalid: spec.replicas: -1')
            assert not info.value.retryable and info.value.status == 422
            cluster.close()

    run(scenario())


def test_load_configuration_names_the_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ApplyError, match=f"cannot load Kubernetes credentials from {tmp_path}/nope"):
        Cluster.connect(tmp_path / "nope")
