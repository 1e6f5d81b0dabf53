"""The operator run for real (kopf, in this process) against a kmock Kubernetes API over HTTP.

Creating, changing and deleting an InferenceEndpoint must issue the expected server-side applies
(PATCH with application/apply-patch+yaml) and deletions, and patch status conditions back; spec
and render errors become Degraded with their reason, the operator keeps running.

Two renderers: the real ``render_endpoint`` (the expected applies are computed from it, or the
Degraded reason while it is a placeholder), and a small fake one so the apply/prune/delete paths
are exercised on every branch.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))

from kube_mock import APPLY_CONTENT_TYPE, RESOURCES, ApplyingEmulator, mock_server, until, write_kubeconfig

from tideserve.errors import SpecError
from tideserve.k8s import names
from tideserve.k8s.apply import Cluster
from tideserve.k8s.operator import DO_NOT_DISRUPT, FINALIZER, make_settings, run_operator
from tideserve.k8s.render import RenderOptions, render_endpoint
from tideserve.spec import load_endpoint

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
IE = f"{names.GROUP}/{names.VERSION}/{names.PLURAL}"
IE_PATH = f"/apis/{names.GROUP}/{names.VERSION}/namespaces/default/{names.PLURAL}"
NS = "default"


def body_of(example: str, generation: int = 1) -> dict[str, Any]:
    body = yaml.safe_load((EXAMPLES / example).read_text())
    body["metadata"].update(namespace=NS, uid=f"uid-{body['metadata']['name']}", generation=generation,
                            resourceVersion="1")
    return body


def fake_render(ep: Any, opts: RenderOptions) -> list[dict]:
    """Enough of the real shape: gateway Deployment + Service, per pool a Deployment, ScaledObject
    and PDB, and one cluster-scoped object (to exercise labels-only ownership)."""
    ep_name = ep.metadata.name
    out: list[dict] = [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": names.gateway_name(ep_name)},
         "spec": {"replicas": 1}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": names.gateway_name(ep_name)},
         "spec": {"type": "LoadBalancer", "ports": [{"port": names.GATEWAY_PORT}]}},
    ]
    for pool in ep.spec.pools:
        n = names.worker_name(ep_name, pool.name)
        labels = {names.LABEL_POOL: pool.name, names.LABEL_COMPONENT: "worker"}
        out += [
            {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": n, "labels": labels},
             "spec": {"replicas": pool.replicas.min}},
            {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": n},
             "spec": {"scaleTargetRef": {"name": n}, "minReplicaCount": pool.replicas.min,
                      "maxReplicaCount": pool.replicas.max}},
            {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": n},
             "spec": {"maxUnavailable": 1}},
        ]
    out.append({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                "metadata": {"name": f"tideserve-{ep_name}"}, "value": 1000})
    return out


@contextlib.asynccontextmanager
async def operator(tmp_path: Path, mock: ApplyingEmulator, namespaces: list[str] | None = None,
                   **kwargs: Any) -> AsyncIterator[None]:
    """The operator (cluster-wide, standalone) against ``mock`` until the block ends, in its own
    thread and event loop as in production (kopf also waits for every task of its loop when it
    stops, which would include the mock server's); fails the test if the operator crashed."""
    cluster = Cluster.connect(write_kubeconfig(tmp_path / "kubeconfig", str(mock.url).rstrip("/")))
    stop, ready = threading.Event(), threading.Event()
    crashed: list[BaseException] = []

    def main() -> None:
        try:
            settings = make_settings(consistency_timeout_s=0.5)
            # kmock cannot serve GET /api/v1/namespaces (its URL parser fails on it), which kopf's
            # namespace scanning lists in namespaced mode: the watched namespaces are exact names here.
            settings.scanning.disabled = bool(namespaces)
            asyncio.run(run_operator(cluster, namespaces=namespaces, stop_flag=stop, ready_flag=ready,
                                     settings=settings, observe_interval_s=0.2,
                                     **kwargs))
        except BaseException as exc:  # reported to the test below
            crashed.append(exc)

    thread = threading.Thread(target=main, name="operator", daemon=True)
    thread.start()
    try:
        await until("operator ready", lambda: ready.is_set() or crashed)
        yield
        assert thread.is_alive() and not crashed, f"the operator stopped by itself: {crashed}"
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 60)
        assert not thread.is_alive(), "the operator did not stop within 60 s"
        cluster.close()


async def set_status(mock: ApplyingEmulator, api_version: str, plural: str, name: str, status: dict) -> None:
    """Play the controller that owns an object's status (Deployment controller, cloud LB)."""
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    resp = await mock.patch(f"{base}/namespaces/{NS}/{plural}/{name}/status", json={"status": status},
                            headers={"Content-Type": "application/merge-patch+json"})
    assert resp.status == 200


def run(coro: Any) -> None:
    asyncio.run(asyncio.wait_for(coro, 240))  # a safety net under pytest's 300 s, not a speed bound


def ctype(req: Any) -> str:
    return (req.headers.get("Content-Type") or "").split(";")[0].strip()


def applies(mock: ApplyingEmulator) -> list[Any]:
    return [r for r in mock if r.method == "PATCH" and ctype(r) == APPLY_CONTENT_TYPE]


def applied_set(mock: ApplyingEmulator) -> set[tuple[str, str]]:
    return {(r.data["kind"], r.data["metadata"]["name"]) for r in applies(mock)}


def deletes(mock: ApplyingEmulator, since: int = 0) -> set[tuple[str, str]]:
    return {(r.resource.plural, r.name) for r in list(mock)[since:] if r.method == "DELETE"}


def endpoint(mock: ApplyingEmulator, name: str) -> Any:
    return mock.objects[IE, NS, name]


def cond(mock: ApplyingEmulator, name: str, kind: str) -> dict[str, Any] | None:
    obj = endpoint(mock, name)
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return dict(c)
    return None


def cond_is(mock: ApplyingEmulator, name: str, kind: str, status: str, reason: str | None = None) -> Any:
    c = cond(mock, name, kind)
    return c if c and c["status"] == status and (reason is None or c["reason"] == reason) else None


# -- the fake renderer: create, change, delete --------------------------------------------------------

def test_create_change_delete_apply_prune_and_conditions(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with mock_server() as mock, operator(tmp_path, mock, render=fake_render):
            body = body_of("whisper-heterogeneous.yaml")
            name = body["metadata"]["name"]
            assert (await mock.post(IE_PATH, json=body)).status == 200
            pools = ("cpu-int8", "cpu-fp32")
            expected = {("Deployment", f"{name}-gateway"), ("Service", f"{name}-gateway"),
                        ("PriorityClass", f"tideserve-{name}")}
            expected |= {(k, f"{name}-{p}") for p in pools for k in ("Deployment", "ScaledObject", "PodDisruptionBudget")}
            # Applied, but nothing runs yet (no Deployment controller here): Ready False, Progressing.
            waiting = await until("applied, Progressing", lambda: cond_is(mock, name, "Ready", "False", "Progressing"))
            assert waiting["message"] == "waiting for: gateway 0 ready"
            assert cond_is(mock, name, "Degraded", "False", "AsExpected")
            assert applied_set(mock) == expected
            status = endpoint(mock, name)["status"]
            assert (status["observedGeneration"], status["appliedObjects"], status["pruned"]) == (1, 9, [])
            assert status["appliedKinds"] == ["apps/v1/Deployment", "keda.sh/v1alpha1/ScaledObject",
                                              "policy/v1/PodDisruptionBudget", "scheduling.k8s.io/v1/PriorityClass",
                                              "v1/Service"]
            assert FINALIZER in endpoint(mock, name)["metadata"]["finalizers"]

            # Every apply is a server-side apply by our field manager, forced.
            for req in applies(mock):
                assert req.params == {"fieldManager": "tideserve", "force": "true"}
            # Namespaced objects: labels, namespace and the controller owner reference.
            dep = mock.objects["apps/v1/deployments", NS, f"{name}-cpu-int8"]
            assert dep["metadata"]["labels"] == {names.LABEL_POOL: "cpu-int8", names.LABEL_COMPONENT: "worker",
                                                 names.LABEL_ENDPOINT: name, names.LABEL_MANAGED_BY: "tideserve"}
            assert dep["metadata"]["ownerReferences"] == [{
                "apiVersion": "tideserve.io/v1alpha1", "kind": "InferenceEndpoint", "name": name,
                "uid": f"uid-{name}", "controller": True, "blockOwnerDeletion": True}]
            # The cluster-scoped object: labels only (an owner reference cannot point to a namespaced owner).
            pc = mock.objects["scheduling.k8s.io/v1/priorityclasses", None, f"tideserve-{name}"]
            assert "ownerReferences" not in pc["metadata"] and "namespace" not in pc["metadata"]
            assert pc["metadata"]["labels"][names.LABEL_ENDPOINT] == name
            # The worker token: created once, 32 random bytes.
            secret = mock.objects["v1/secrets", NS, f"{name}-worker-token"]
            token = base64.b64decode(secret["data"]["token"])
            assert len(token) == 43  # token_urlsafe(32)

            # The gateway becomes ready and its NLB gets a hostname: the timer turns Ready True.
            await set_status(mock, "apps/v1", "deployments", f"{name}-gateway", {"replicas": 1, "readyReplicas": 1})
            await set_status(mock, "v1", "services", f"{name}-gateway",
                             {"loadBalancer": {"ingress": [{"hostname": "gw-123.elb.us-east-1.amazonaws.com"}]}})
            ready = await until("Ready=True", lambda: cond_is(mock, name, "Ready", "True", "Available"))
            assert ready["message"] == "gateway 1 ready; pools: cpu-int8 0 ready (min 0), cpu-fp32 0 ready (min 0)"
            await until("address", lambda: endpoint(mock, name)["status"].get("address"))
            status = endpoint(mock, name)["status"]
            assert status["address"] == "gw-123.elb.us-east-1.amazonaws.com"
            assert status["pools"] == [
                {"name": "cpu-int8", "accelerator": "cpu", "target": "cpu-x86_64-int8", "replicas": 0,
                 "readyReplicas": 0, "desiredReplicas": 0},
                {"name": "cpu-fp32", "accelerator": "cpu", "target": "cpu-x86_64-fp32", "replicas": 0,
                 "readyReplicas": 0, "desiredReplicas": 0}]

            # Change: drop the fp32 pool -> its three objects are pruned, the rest re-applied; the
            # int8 pool now needs one ready replica -> Progressing until it has one.
            before = len(list(mock))
            changed = copy.deepcopy(body["spec"])
            changed["pools"] = [p for p in changed["pools"] if p["name"] == "cpu-int8"]
            changed["pools"][0]["replicas"]["min"] = 1
            resp = await mock.patch(f"{IE_PATH}/{name}", json={"metadata": {"generation": 2}, "spec": {"pools": changed["pools"]}},
                                    headers={"Content-Type": "application/merge-patch+json"})
            assert resp.status == 200
            waiting = await until("status for generation 2",
                                  lambda: endpoint(mock, name)["status"].get("observedGeneration") == 2
                                  and cond_is(mock, name, "Ready", "False", "Progressing"))
            assert waiting["message"] == "waiting for: pool cpu-int8: 0 ready < minimum 1"
            assert deletes(mock, before) == {("deployments", f"{name}-cpu-fp32"), ("scaledobjects", f"{name}-cpu-fp32"),
                                             ("poddisruptionbudgets", f"{name}-cpu-fp32")}
            assert mock.objects["apps/v1/deployments", NS, f"{name}-cpu-fp32"].deleted
            assert not mock.objects["apps/v1/deployments", NS, f"{name}-cpu-int8"].deleted
            assert endpoint(mock, name)["status"]["pruned"] == [
                f"Deployment default/{name}-cpu-fp32", f"ScaledObject default/{name}-cpu-fp32",
                f"PodDisruptionBudget default/{name}-cpu-fp32"]  # by kind: apps, keda.sh, policy
            await set_status(mock, "apps/v1", "deployments", f"{name}-cpu-int8", {"replicas": 1, "readyReplicas": 1})
            ready = await until("Ready with the pool at its minimum", lambda: cond_is(mock, name, "Ready", "True"))
            assert ready["message"] == "gateway 1 ready; pools: cpu-int8 1 ready (min 1)"
            # Re-apply never rotates the token (no apply of the Secret, create answered 409).
            assert mock.objects["v1/secrets", NS, f"{name}-worker-token"]["data"]["token"] == secret["data"]["token"]
            assert ("Secret", f"{name}-worker-token") not in applied_set(mock)

            # Delete: the finalizer runs the delete handler, which removes only the cluster-scoped
            # object; namespaced children are the garbage collector's (owner references).
            before = len(list(mock))
            assert (await mock.delete(f"{IE_PATH}/{name}")).status == 200
            await until("endpoint gone", lambda: endpoint(mock, name).deleted)
            assert deletes(mock, before) == {("inferenceendpoints", name), ("priorityclasses", f"tideserve-{name}")}

    run(scenario())


def test_invalid_spec_is_degraded_then_recovers_when_fixed(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with mock_server() as mock, operator(tmp_path, mock, render=fake_render):
            body = body_of("whisper-tiny-en.yaml")
            name = body["metadata"]["name"]
            body["spec"]["pools"][0]["replicas"] = {"min": 3, "max": 1}
            body["spec"]["pools"][0]["max_concurency"] = 8
            await mock.post(IE_PATH, json=body)
            degraded = await until("Degraded InvalidSpec", lambda: cond_is(mock, name, "Degraded", "True", "InvalidSpec"))
            assert "spec.pools[0].replicas" in degraded["message"]
            assert "unknown field 'max_concurency'; did you mean 'max_concurrency'?" in degraded["message"]
            assert cond_is(mock, name, "Ready", "False", "InvalidSpec")
            assert applies(mock) == []

            fixed = copy.deepcopy(body["spec"]["pools"])
            fixed[0]["replicas"] = {"min": 0, "max": 2}
            fixed[0].pop("max_concurency")
            await mock.patch(f"{IE_PATH}/{name}", json={"metadata": {"generation": 2}, "spec": {"pools": fixed}},
                             headers={"Content-Type": "application/merge-patch+json"})
            await until("not Degraded after the fix", lambda: cond_is(mock, name, "Degraded", "False", "AsExpected"))
            assert cond_is(mock, name, "Ready", "False", "Progressing")  # applied; nothing runs in the mock
            assert ("Deployment", f"{name}-cpu") in applied_set(mock)

    run(scenario())


def test_render_error_is_degraded_not_a_crash(tmp_path: Path) -> None:
    calls: list[str] = []

    def failing_render(ep: Any, opts: RenderOptions) -> list[dict]:
        calls.append(ep.metadata.name)
        raise SpecError("pool cpu: no engine target for this accelerator")

    async def scenario() -> None:
        async with mock_server() as mock, operator(tmp_path, mock, render=failing_render):
            body = body_of("whisper-tiny-en.yaml")
            await mock.post(IE_PATH, json=body)
            c = await until("Degraded RenderFailed", lambda: cond_is(mock, "whisper", "Degraded", "True", "RenderFailed"))
            assert c["message"] == "cannot render whisper: pool cpu: no engine target for this accelerator"
            assert applies(mock) == []
        # Handled, not retried: the same spec gives the same error. (kopf may see the object
        # twice on start, as kmock lists and then streams it; never a retry loop.)
        assert 1 <= len(calls) <= 2

    run(scenario())


def test_unserved_kind_is_degraded_and_retried(tmp_path: Path) -> None:
    def render_widget(ep: Any, opts: RenderOptions) -> list[dict]:
        return [{"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}]

    async def scenario() -> None:
        async with mock_server() as mock, operator(tmp_path, mock, render=render_widget, retry_delay_s=0.2):
            await mock.post(IE_PATH, json=body_of("whisper-tiny-en.yaml"))
            c = await until("Degraded ApplyFailed", lambda: cond_is(mock, "whisper", "Degraded", "True", "ApplyFailed"))
            assert "does not serve Widget (example.com/v1)" in c["message"]
            # Retried after retry_delay_s (a CRD may be installed meanwhile): discovery asked again.
            await until("a retry", lambda: sum(1 for r in mock if r.url.path == "/apis/example.com/v1") >= 2)

    run(scenario())


def test_namespaced_operator_ignores_other_namespaces(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with mock_server() as mock, operator(tmp_path, mock, namespaces=[NS], render=fake_render):
            other = body_of("whisper-tiny-en.yaml")
            other["metadata"].update(namespace="elsewhere", uid="uid-other")
            await mock.post(f"/apis/{names.GROUP}/{names.VERSION}/namespaces/elsewhere/{names.PLURAL}", json=other)
            await mock.post(IE_PATH, json=body_of("whisper-tiny-en.yaml"))
            await until("the watched namespace's endpoint applied",
                        lambda: cond_is(mock, "whisper", "Degraded", "False", "AsExpected"))
            assert not mock.objects[IE, "elsewhere", "whisper"].get("status")
            # The only request about that namespace is the test's own creation of the object.
            assert [r.method for r in mock if r.namespace == "elsewhere"] == ["POST"]
            assert not [r for r in mock if r.url.path == f"/apis/{names.GROUP}/{names.VERSION}/{names.PLURAL}"]

    run(scenario())


# -- the real renderer ---------------------------------------------------------------------------

def _declare_kinds(mock: ApplyingEmulator, manifests: list[dict]) -> None:
    known = {(key.rsplit("/", 1)[0], kind) for key, (kind, _, _) in RESOURCES.items()}
    for m in manifests:
        if (m["apiVersion"], m["kind"]) not in known:
            plural = m["kind"].lower() + ("es" if m["kind"].endswith("s") else "s")
            mock.resources[f"{m['apiVersion']}/{plural}"] = {
                "kind": m["kind"], "namespaced": "namespace" in m.get("metadata", {}), "singular": m["kind"].lower(),
                "verbs": ["get", "list", "patch", "delete", "create"], "shortnames": [], "categories": [],
                "subresources": []}


@pytest.mark.parametrize("example", ["whisper-tiny-en.yaml", "whisper-heterogeneous.yaml"])
def test_real_renderer_applies_what_it_renders(tmp_path: Path, example: str) -> None:
    ep = load_endpoint(EXAMPLES / example)
    try:
        manifests: list[dict] | None = render_endpoint(ep, RenderOptions(namespace=NS))
    except NotImplementedError:
        manifests = None  # the renderer is still the placeholder on this branch

    async def scenario() -> None:
        async with mock_server() as mock:
            if manifests is not None:
                _declare_kinds(mock, manifests)
            async with operator(tmp_path, mock):
                await mock.post(IE_PATH, json=body_of(example))
                name = ep.metadata.name
                if manifests is None:
                    c = await until("Degraded RendererNotImplemented",
                                    lambda: cond_is(mock, name, "Degraded", "True", "RendererNotImplemented"))
                    assert c["message"].startswith("the Kubernetes renderer is not implemented")
                    assert applies(mock) == []
                else:
                    await until("applied", lambda: cond_is(mock, name, "Degraded", "False", "AsExpected"))
                    assert applied_set(mock) == {(m["kind"], m["metadata"]["name"]) for m in manifests}

    run(scenario())


# -- worker pods: do-not-disrupt released once Ready ----------------------------------------------

def _pod(name: str, ready: bool, worker: bool = True) -> dict[str, Any]:
    labels = {names.LABEL_ENDPOINT: "whisper", names.LABEL_COMPONENT: "worker" if worker else "gateway"}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "resourceVersion": "1",
                         "labels": labels, "annotations": {DO_NOT_DISRUPT: "true", "keep": "me"}},
            "spec": {"containers": [{"name": "worker", "image": "x"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_ready_worker_pod_loses_do_not_disrupt(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with mock_server() as mock, operator(tmp_path, mock, render=fake_render):
            pods = "/api/v1/namespaces/default/pods"
            for pod in (_pod("loading", ready=False), _pod("gateway", ready=True, worker=False), _pod("ready", ready=True)):
                await mock.post(pods, json=pod)

            def annotations(name: str) -> dict[str, str]:
                return dict(mock.objects["v1/pods", NS, name]["metadata"].get("annotations") or {})

            await until("ready pod released", lambda: DO_NOT_DISRUPT not in annotations("ready"))
            assert annotations("ready") == {"keep": "me"}
            assert DO_NOT_DISRUPT in annotations("loading")
            # The loading pod becomes Ready -> released too.
            await mock.patch(f"{pods}/loading/status", json={"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
                             headers={"Content-Type": "application/merge-patch+json"})
            await until("loading pod released once Ready", lambda: DO_NOT_DISRUPT not in annotations("loading"))
            # Not a worker: never touched.
            assert annotations("gateway") == {DO_NOT_DISRUPT: "true", "keep": "me"}
            assert not [r for r in mock if r.method == "PATCH" and r.name == "gateway"]

    run(scenario())


def test_render_options_reach_every_endpoint_with_its_own_namespace(tmp_path: Path) -> None:
    seen: list[RenderOptions] = []

    def capturing_render(ep: Any, opts: RenderOptions) -> list[dict]:
        seen.append(opts)
        return fake_render(ep, opts)

    options = RenderOptions(image="registry.example/tideserve:1", load_balancer_scheme="internet-facing",
                            s3_region="eu-west-1")

    async def scenario() -> None:
        async with mock_server() as mock, operator(tmp_path, mock, render=capturing_render, options=options):
            await mock.post(IE_PATH, json=body_of("whisper-tiny-en.yaml"))
            await until("rendered", lambda: seen)

    run(scenario())
    assert (seen[0].namespace, seen[0].image, seen[0].load_balancer_scheme, seen[0].s3_region) == (
        NS, "registry.example/tideserve:1", "internet-facing", "eu-west-1")
