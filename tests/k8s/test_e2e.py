"""tideserve's Kubernetes mode on a real control plane (tests/k8s/localcluster.py): every
assertion reads objects back from the API server.

One scenario, in order (the tests share the module's state):

1. the install base (deploy/kustomize: our CRD, the restricted namespace, the operator's
   ServiceAccount + ClusterRole + binding, its Deployment) applies; the rendered cluster objects
   (examples/cluster.yaml: PriorityClasses, EC2NodeClass, the GPU NodePools) apply, the NodePools
   with their nodeClassRef rewritten to the kwok provider's KWOKNodeClass;
2. ``tideserve operator`` runs with a token of its ServiceAccount (RBAC as we render it, not
   admin) and applies the two-pool GPU example into a namespace enforcing the restricted Pod
   Security standard: Deployments, Services, ScaledObjects, PDBs... owned by the endpoint and
   reported in its status conditions;
3. KEDA calls our scaler (``tideserve gateway`` on loopback) and scales a pool 0 -> 1 while
   requests are held; Karpenter launches a kwok node of that pool's GPU for the pending pod;
   1 -> N through the HPA (KEDA's metrics adapter); back to 0 after the cooldown, and Karpenter
   removes the empty node;
4. deleting the endpoint deletes everything it owned.
"""

from __future__ import annotations

import asyncio
import copy
import json
import sys
import threading
import time
from pathlib import Path

import aiohttp
import pytest
import yaml

from kube import Kube, KubeError, wait_for
from localcluster import HOST, Proc, free_port, require
from tideserve.k8s.cluster import ClusterConfig, render_cluster
from upstream import module_file, versions

REPO = Path(__file__).resolve().parents[2]
NS = "ml"
EP = "whisper-gpu"
OPERATOR_NS = "tideserve-system"
SCALE_TO_ZERO_S = 20
CONSOLIDATE_AFTER_S = 5
TIDESERVE = str(Path(sys.executable).parent / "tideserve")
SELECTOR = f"tideserve.io/endpoint={EP}"

pytestmark = pytest.mark.timeout(900)


def cond(obj: dict | None, kind: str) -> dict | None:
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c.get("type") == kind), None)


def is_true(obj: dict | None, kind: str) -> bool:
    c = cond(obj, kind)
    return bool(c and c.get("status") == "True")


class HeldRequests:
    """Requests to the gateway, kept open (held: no worker is reachable from here) until cancelled."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.loop = asyncio.new_event_loop()
        self.tasks: list[asyncio.Task] = []
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.session: aiohttp.ClientSession | None = None

    async def _post(self) -> int:
        if self.session is None:
            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900))
        async with self.session.post(self.url + "/invocations", json={"audio_data": "", "whisper_prompt": ""}) as r:
            await r.read()
            return r.status

    def add(self, n: int) -> None:
        def start():
            for _ in range(n):
                self.tasks.append(self.loop.create_task(self._post()))
        self.loop.call_soon_threadsafe(start)

    def cancel(self) -> None:
        async def cancel_all():
            for t in self.tasks:
                t.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            if self.session is not None:
                await self.session.close()
                self.session = None
            self.tasks.clear()
        asyncio.run_coroutine_threadsafe(cancel_all(), self.loop).result(30)

    def close(self) -> None:
        try:
            self.cancel()
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)


# -- the module's stack ----------------------------------------------------------------------
def _endpoint_doc(namespace: str | None = NS) -> dict:
    """The two-pool GPU example with a short cooldown; ``namespace`` None: as the gateway reads it."""
    doc = yaml.safe_load((REPO / "examples" / "whisper-a10g-l40s.yaml").read_text())
    if namespace:
        doc["metadata"]["namespace"] = namespace
    a = doc["spec"]["autoscaling"]
    a.update({"scale_to_zero_after_s": SCALE_TO_ZERO_S, "scale_down_stabilization_s": 5, "interval_s": 1})
    doc["spec"]["gateway"].update({"hold_timeout_s": 800, "request_timeout_s": 850})
    return doc


def _cluster_objects() -> list[dict]:
    cfg = yaml.safe_load((REPO / "examples" / "cluster.yaml").read_text())
    for fam in cfg["gpu_families"]:
        # no maintenance window (it would block consolidation during weekday hours) and a short wait
        fam["consolidate_after_s"] = CONSOLIDATE_AFTER_S
        fam["budgets"] = [{"nodes": "100%"}]
    return render_cluster(ClusterConfig.model_validate(cfg))


@pytest.fixture(scope="module")
def stack(cluster, tmp_path_factory):
    require(cluster, "kube-apiserver", "kube-controller-manager", "kube-scheduler", "crds")
    kube = cluster.kube
    tmp = tmp_path_factory.mktemp("stack")
    state: dict = {"kube": kube, "cluster": cluster, "tmp": tmp, "measurements": []}
    cluster.measurements = state["measurements"]

    # 1. the install base, as committed in deploy/kustomize
    for f in ("crd.yaml", "namespace.yaml", "rbac.yaml", "operator.yaml"):
        kube.apply_all(list(yaml.safe_load_all((REPO / "deploy" / "kustomize" / f).read_text())))
    kube.wait_crd("inferenceendpoints.tideserve.io")
    # Karpenter's AWS NodeClass CRD, so that our EC2NodeClass meets the API server's own validation
    aws_crd = module_file("github.com/aws/karpenter-provider-aws", versions()["KARPENTER_AWS_VERSION"],
                          "pkg/apis/crds/karpenter.k8s.aws_ec2nodeclasses.yaml")
    kube.apply_all([d for d in yaml.safe_load_all(aws_crd.read_text()) if d])
    kube.wait_crd("ec2nodeclasses.karpenter.k8s.aws")
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "monitoring"}})
    objs = _cluster_objects()
    state["cluster_objects"] = copy.deepcopy(objs)
    for o in objs:
        if o["kind"] == "NodePool":  # the kwok provider knows only its own NodeClass
            o["spec"]["template"]["spec"]["nodeClassRef"] = {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass",
                                                             "name": "default"}
        kube.apply(o)
    kube.apply({"apiVersion": "karpenter.kwok.sh/v1alpha1", "kind": "KWOKNodeClass", "metadata": {"name": "default"}})
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    kube.merge_patch("karpenter.kwok.sh/v1alpha1", "KWOKNodeClass", "default", {"status": {"conditions": [
        {"type": "Ready", "status": "True", "reason": "Ready", "message": "", "lastTransitionTime": now,
         "observedGeneration": 1}]}}, subresource="status")

    # 2. the endpoint's namespace enforces the restricted Pod Security standard
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS, "labels": {
        "pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}}})

    # 3. our gateway on loopback: the scaler KEDA calls (no worker is reachable from here, so requests are held)
    endpoint_file = tmp / "endpoint.yaml"
    endpoint_file.write_text(yaml.safe_dump(_endpoint_doc(None)))
    port_file = tmp / "gateway.ports"
    gw = Proc("tideserve-gateway", [TIDESERVE, "gateway", str(endpoint_file), "--namespace", NS, "--host", HOST,
                                    "--port", "0", "--scaler-port", "0", "--discovery", "static",
                                    "--port-file", str(port_file), "--log-format", "text"],
              cluster.root / "logs" / "tideserve-gateway.log").start()
    cluster.procs[gw.name] = gw
    ports = wait_for("the gateway's port file", lambda: port_file.exists() and json.loads(port_file.read_text() or "{}"),
                     60)
    state["gateway_url"] = f"http://{HOST}:{ports['port']}"
    state["scaler_address"] = f"{HOST}:{ports['scaler_port']}"

    # 4. the operator, as its ServiceAccount (a bound token; RBAC from deploy/kustomize/rbac.yaml)
    kubeconfig, token = cluster.token_kubeconfig(OPERATOR_NS, "tideserve-operator", tmp / "operator.kubeconfig")
    state["operator_kube"] = Kube(cluster.server, str(cluster.ca), token=token)
    op = Proc("tideserve-operator", [TIDESERVE, "operator", "--all-namespaces", "--kubeconfig", str(kubeconfig),
                                     "--image", "registry.example/tideserve:1.2.3",
                                     "--scaler-address", state["scaler_address"],
                                     "--liveness", f"http://{HOST}:{free_port()}/healthz", "--log-format", "text"],
              cluster.root / "logs" / "tideserve-operator.log").start()
    cluster.procs[op.name] = op
    state["operator"] = op
    state["load"] = HeldRequests(state["gateway_url"])
    yield state
    state["load"].close()
    state["operator_kube"].close()


# -- 1. install base ---------------------------------------------------------------------------
def test_install_base_and_cluster_objects_apply(stack):
    kube = stack["kube"]
    ns = kube.get("v1", "Namespace", OPERATOR_NS)
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    _check_cluster_objects(stack)
    require(stack["cluster"], "kwok")
    # the operator's Deployment passes restricted admission: its pod exists and runs (kwok's node)
    pods = wait_for("the operator Deployment's pod Ready",
                    lambda: [p for p in kube.list("v1", "Pod", OPERATOR_NS) if is_true(p, "Ready")], 120)
    assert pods[0]["spec"]["nodeName"] == "system-0"


def _check_cluster_objects(stack) -> None:
    kube = stack["kube"]
    for o in stack["cluster_objects"]:
        got = kube.get(o["apiVersion"], o["kind"], o["metadata"]["name"], o["metadata"].get("namespace"))
        assert got is not None, f"{o['kind']} {o['metadata']['name']} was not stored"
        if o["kind"] == "NodePool":  # stored as rendered but for the NodeClass
            want = copy.deepcopy(o["spec"])
            want["template"]["spec"].pop("nodeClassRef")
            have = copy.deepcopy(got["spec"])
            assert have["template"]["spec"].pop("nodeClassRef")["kind"] == "KWOKNodeClass"
            for k, v in want.items():
                if k != "template":
                    assert have[k] == v, k
            assert have["template"]["spec"]["requirements"] == want["template"]["spec"]["requirements"]
            assert have["template"]["spec"]["taints"] == want["template"]["spec"]["taints"]


# -- 2. the operator ---------------------------------------------------------------------------
EXPECTED = {
    ("apps/v1", "Deployment"): {f"{EP}-gateway", f"{EP}-a10g", f"{EP}-l40s"},
    ("v1", "Service"): {f"{EP}-gateway", f"{EP}-scaler", f"{EP}-a10g", f"{EP}-l40s"},
    ("keda.sh/v1alpha1", "ScaledObject"): {f"{EP}-a10g", f"{EP}-l40s"},
    ("policy/v1", "PodDisruptionBudget"): {f"{EP}-a10g", f"{EP}-l40s"},
    ("v1", "ConfigMap"): {f"{EP}-config"},
    ("v1", "PersistentVolumeClaim"): {f"{EP}-model"},
    ("monitoring.coreos.com/v1", "PodMonitor"): {f"{EP}-workers"},
    ("monitoring.coreos.com/v1", "ServiceMonitor"): {f"{EP}-gateway"},
}


def test_operator_applies_owned_objects_and_reports_ready(stack):
    kube = stack["kube"]
    kube.apply(_endpoint_doc())
    require(stack["cluster"], "kwok")  # Ready needs the gateway's pod Ready: kwok's node
    ie = wait_for("InferenceEndpoint Ready=True", lambda: (lambda o: o if is_true(o, "Ready") else None)(
        kube.get("tideserve.io/v1alpha1", "InferenceEndpoint", EP, NS)), 180)
    stack["uid"] = uid = ie["metadata"]["uid"]
    st = ie["status"]
    assert st["observedGeneration"] == ie["metadata"]["generation"]
    assert cond(ie, "Degraded")["status"] == "False"
    assert cond(ie, "Ready")["reason"] == "Available"
    assert st["appliedObjects"] >= sum(len(v) for v in EXPECTED.values())
    assert {p["name"] for p in st["pools"]} == {"a10g", "l40s"}
    for (api, kind), names in EXPECTED.items():
        items = kube.list(api, kind, NS, SELECTOR)
        assert {i["metadata"]["name"] for i in items} >= names, kind
        for i in items:
            if i["metadata"]["name"] in names:
                owners = [o for o in i["metadata"].get("ownerReferences") or [] if o.get("controller")]
                assert owners == [{"apiVersion": "tideserve.io/v1alpha1", "kind": "InferenceEndpoint", "name": EP,
                                   "uid": uid, "controller": True, "blockOwnerDeletion": True}], (kind, owners)
    # the worker-token Secret the operator created, owned too
    secret = kube.get("v1", "Secret", f"{EP}-worker-token", NS)
    assert secret and secret["metadata"]["ownerReferences"][0]["uid"] == uid
    # the cluster-scoped model PV carries the endpoint's labels (no owner reference possible)
    pvs = kube.list("v1", "PersistentVolume", None, SELECTOR)
    assert pvs, "the model PersistentVolume"
    # the ScaledObjects point KEDA at our gateway's scaler on loopback
    for so in kube.list("keda.sh/v1alpha1", "ScaledObject", NS, SELECTOR):
        assert so["spec"]["triggers"][0]["metadata"]["scalerAddress"] == stack["scaler_address"]
    # the gateway's pod runs on the CPU node; workers are at zero (KEDA) or not yet scaled
    gw = wait_for("gateway pod Ready", lambda: [p for p in kube.list("v1", "Pod", NS, "tideserve.io/component=gateway")
                                                if is_true(p, "Ready")], 60)
    assert gw[0]["spec"]["nodeName"] == "system-0"


def test_operator_runs_as_its_service_account_not_admin(stack):
    ok = stack["operator_kube"]

    def can(verb: str, resource: str, group: str = "", namespace: str | None = NS) -> bool:
        attrs = {"verb": verb, "resource": resource, "group": group}
        if namespace:
            attrs["namespace"] = namespace
        r = ok.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body={
            "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attrs}})
        return r["status"]["allowed"]

    who = ok.request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                     body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    assert who["status"]["userInfo"]["username"] == f"system:serviceaccount:{OPERATOR_NS}:tideserve-operator"
    assert "system:masters" not in who["status"]["userInfo"].get("groups", [])
    assert can("patch", "deployments", "apps") and can("create", "scaledobjects", "keda.sh")
    assert can("patch", "inferenceendpoints/status", "tideserve.io")
    assert not can("list", "secrets") and not can("get", "secrets")
    assert not can("create", "clusterrolebindings", "rbac.authorization.k8s.io", None)
    assert not can("delete", "nodes", "", None)
    assert not can("create", "pods")


def test_restricted_pod_security_is_enforced_in_the_endpoint_namespace(stack):
    kube = stack["kube"]
    # a pod without the restricted settings (root allowed, privilege escalation, capabilities kept)
    bad = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "unrestricted", "namespace": NS},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    with pytest.raises(KubeError) as err:
        kube.create(bad)
    assert err.value.status == 403 and "violates PodSecurity" in str(err.value)
    # ... while every pod of the endpoint was admitted (the gateway's above; workers below)
    assert kube.list("v1", "Pod", NS, "tideserve.io/component=gateway")


# -- 3. KEDA and Karpenter -----------------------------------------------------------------------
def _pool_replicas(kube: Kube) -> dict[str, int]:
    return {d["metadata"]["labels"]["tideserve.io/pool"]: int(d["spec"].get("replicas") or 0)
            for d in kube.list("apps/v1", "Deployment", NS, "tideserve.io/component=worker")}


def test_keda_scales_zero_to_one_and_karpenter_launches_the_pools_gpu_node(stack):
    require(stack["cluster"], "keda", "kwok", "karpenter")
    kube, ms = stack["kube"], stack["measurements"]
    for pool in ("a10g", "l40s"):
        # wait_for calls the check within this iteration; pool is bound anyway (default argument).
        wait_for(f"ScaledObject {pool} Ready", lambda pool=pool: is_true(
            kube.get("keda.sh/v1alpha1", "ScaledObject", f"{EP}-{pool}", NS), "Ready"), 120)
        hpa = wait_for(f"KEDA's HPA for {pool}", lambda pool=pool: kube.get(
            "autoscaling/v2", "HorizontalPodAutoscaler", f"keda-hpa-{EP}-{pool}", NS), 60)
        assert hpa["metadata"]["ownerReferences"][0]["kind"] == "ScaledObject"
        assert hpa["spec"]["scaleTargetRef"]["name"] == f"{EP}-{pool}"
    wait_for("both pools at 0 replicas (KEDA, nothing held)", lambda: _pool_replicas(kube) == {"a10g": 0, "l40s": 0}, 120)
    wait_for("no worker pod", lambda: not kube.list("v1", "Pod", NS, "tideserve.io/component=worker"), 120)
    # (A Deployment created without spec.replicas starts at 1 until KEDA takes it to 0, and
    # Karpenter launches a GPU node for that pod: the render sets replicas at creation.)
    seen = {c["metadata"]["name"] for c in kube.list("karpenter.sh/v1", "NodeClaim")}

    def no_claims():
        claims = kube.list("karpenter.sh/v1", "NodeClaim")
        seen.update(c["metadata"]["name"] for c in claims)
        return not claims
    wait_for("no NodeClaim before the cold start", no_claims, 240)
    ms.append(f"NodeClaims seen before the first request: {len(seen)}")
    # the worker Deployments were created at the pools' minimum (0), so nothing was launched for them
    assert not seen, f"Karpenter launched nodes before any request: {sorted(seen)}"

    t0 = time.monotonic()
    stack["load"].add(3)
    marks: dict[str, float] = {}
    found: dict = {}

    def progress():
        now = time.monotonic() - t0
        if "scaled" not in marks:
            up = [p for p, n in _pool_replicas(kube).items() if n >= 1]
            if up:
                marks["scaled"], found["pool"] = now, up[0]
        if "pool" in found and "pod" not in marks:
            pods = kube.list("v1", "Pod", NS, f"tideserve.io/pool={found['pool']}")
            if pods:
                marks["pod"], found["pod"] = now, pods[0]["metadata"]["name"]
        if "pod" in marks and "nodeclaim" not in marks and kube.list("karpenter.sh/v1", "NodeClaim"):
            marks["nodeclaim"] = now
        if "nodeclaim" in marks and "node" not in marks and \
                [n for n in kube.list("v1", "Node") if n["metadata"]["labels"].get("karpenter.sh/nodepool")]:
            marks["node"] = now
        if "pod" in found:
            pod = kube.get("v1", "Pod", found["pod"], NS)
            if pod and pod["spec"].get("nodeName") and "scheduled" not in marks:
                marks["scheduled"] = now
                for k in ("nodeclaim", "node"):  # both happened before the binding, between two polls
                    marks.setdefault(k, now)
            if pod and is_true(pod, "Ready") and "ready" not in marks:
                marks["ready"] = now
                found["pod_obj"] = pod
                return True
        return False

    wait_for(f"a worker pod Ready (so far: {marks})", progress, 300, interval_s=0.2)
    pool = found["pool"]
    ms.append("held request -> first ready worker pod (s since the requests were sent): " +
              ", ".join(f"{k} {v:.1f}" for k, v in marks.items()))
    phases = {"KEDA polling + scaling (Deployment replicas 0->1)": marks["scaled"],
              "ReplicaSet creates the pod": marks["pod"] - marks["scaled"],
              "scheduling fails, Karpenter batches and creates a NodeClaim": marks["nodeclaim"] - marks["pod"],
              "Karpenter's launch (kwok node registered)": marks["node"] - marks["nodeclaim"],
              "scheduling onto the new node": marks["scheduled"] - marks["node"],
              "pod readiness (kwok)": marks["ready"] - marks["scheduled"]}
    ms.extend(f"  {k}: {v:.1f}s" for k, v in phases.items())
    stack["pool"] = pool

    pod = found["pod_obj"]
    node = kube.get("v1", "Node", pod["spec"]["nodeName"])
    labels = node["metadata"]["labels"]
    accelerator = {"a10g": "a10g", "l40s": "l40s"}[pool]
    assert labels["karpenter.k8s.aws/instance-gpu-name"] == accelerator
    assert labels["karpenter.sh/nodepool"] == f"tideserve-{accelerator}"
    assert labels["node.kubernetes.io/instance-type"].startswith({"a10g": "g5.", "l40s": "g6e."}[pool])
    assert labels["tideserve.io/gpu-family"] == accelerator
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "1"
    assert {"key": "nvidia.com/gpu", "effect": "NoSchedule"} in [
        {k: t[k] for k in ("key", "effect")} for t in node["spec"].get("taints") or []]
    wait_for("the NodeClaim registered with this node", lambda: [
        c for c in kube.list("karpenter.sh/v1", "NodeClaim")
        if (c.get("status") or {}).get("nodeName") == node["metadata"]["name"] and is_true(c, "Registered")], 60)
    # the operator took karpenter.sh/do-not-disrupt off the pod once it was Ready. A CI run
    # (2026-12-07) found that first pod gone (kube.get None) within this wait, while the next
    # test still saw the Deployment at 1 replica: it had been replaced, for a reason the run did
    # not show. So the check looks at the pool's Ready worker pods as they are, each of which must
    # have lost the annotation.
    def ready_pods_disruptable() -> bool:
        ready = [p for p in kube.list("v1", "Pod", NS, f"tideserve.io/pool={pool}") if is_true(p, "Ready")]
        return bool(ready) and all("karpenter.sh/do-not-disrupt" not in (p["metadata"].get("annotations") or {})
                                   for p in ready)
    wait_for("do-not-disrupt removed from the pool's Ready pods", ready_pods_disruptable, 60)
    # and reports the ready replica in the endpoint's status
    wait_for("status.pools shows the ready replica", lambda: any(
        p["name"] == pool and p["readyReplicas"] >= 1
        for p in kube.get("tideserve.io/v1alpha1", "InferenceEndpoint", EP, NS)["status"].get("pools") or []), 60)


def test_a_spec_change_rolls_out_and_keeps_kedas_replica_count(stack):
    """The operator re-applies the Deployments (new config hash: a rollout) and leaves
    spec.replicas, which KEDA set, alone."""
    require(stack["cluster"], "keda", "kwok", "karpenter")
    if "pool" not in stack:
        pytest.fail("the 0 -> 1 test did not get a pool to 1", pytrace=False)
    kube, pool = stack["kube"], stack["pool"]
    name = f"{EP}-{pool}"
    before = kube.get("apps/v1", "Deployment", name, NS)
    assert before["spec"]["replicas"] == 1
    kube.merge_patch("tideserve.io/v1alpha1", "InferenceEndpoint", EP, {"spec": {"batching": {"max_queue_delay_ms": 25}}}, NS)
    gen = kube.get("tideserve.io/v1alpha1", "InferenceEndpoint", EP, NS)["metadata"]["generation"]
    wait_for("the new generation applied", lambda: kube.get("tideserve.io/v1alpha1", "InferenceEndpoint", EP, NS)
             ["status"].get("observedGeneration") == gen, 120)
    after = wait_for("the rollout finished", lambda: (lambda d: d if d["metadata"]["generation"] > before["metadata"]["generation"]
                     and d["status"].get("observedGeneration") == d["metadata"]["generation"]
                     and d["status"].get("updatedReplicas") == d["status"].get("readyReplicas") == 1
                     and d["status"].get("replicas") == 1 else None)(kube.get("apps/v1", "Deployment", name, NS)), 180)
    assert after["spec"]["template"]["metadata"]["annotations"]["tideserve.io/config-sha256"] != \
        before["spec"]["template"]["metadata"]["annotations"]["tideserve.io/config-sha256"]
    assert after["spec"]["replicas"] == 1, "the re-apply reset KEDA's replica count"
    managers = {(m["manager"], m["operation"]) for m in after["metadata"]["managedFields"]}
    assert ("tideserve", "Apply") in managers


def test_hpa_scales_one_to_n_from_the_external_metric(stack):
    require(stack["cluster"], "keda", "keda-adapter", "kwok", "karpenter")
    if "pool" not in stack:
        pytest.fail("the 0 -> 1 test did not get a pool to 1", pytrace=False)
    kube, pool = stack["kube"], stack["pool"]
    stack["load"].add(14)  # 17 held, target 8 a replica: 3
    so = f"{EP}-{pool}"

    def metric():
        hpa = kube.get("autoscaling/v2", "HorizontalPodAutoscaler", f"keda-hpa-{so}", NS)
        name = hpa["spec"]["metrics"][0]["external"]["metric"]["name"]
        v = kube.request("GET", f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{NS}/{name}",
                         params={"labelSelector": f"scaledobject.keda.sh/name={so}"})
        return v["items"] if v["items"] else None
    items = wait_for("the external metric through the aggregator", metric, 60)
    assert items[0]["metricName"].startswith("s0-")
    hpa = wait_for("HPA desiredReplicas > 1", lambda: (lambda h: h if (h.get("status") or {}).get("desiredReplicas", 0) > 1
                                                       else None)(kube.get("autoscaling/v2", "HorizontalPodAutoscaler",
                                                                           f"keda-hpa-{so}", NS)), 120)
    want = hpa["status"]["desiredReplicas"]
    wait_for(f"{want} replicas of {pool}", lambda: _pool_replicas(kube)[pool] >= 2, 60)
    wait_for("more than one Ready worker pod", lambda: len([
        p for p in kube.list("v1", "Pod", NS, f"tideserve.io/pool={pool}") if is_true(p, "Ready")]) >= 2, 240)
    nodes = [n for n in kube.list("v1", "Node") if n["metadata"]["labels"].get("karpenter.sh/nodepool")]
    assert len(nodes) >= 2


def test_scale_back_to_zero_after_cooldown_and_karpenter_consolidates(stack):
    require(stack["cluster"], "keda", "kwok", "karpenter")
    if "pool" not in stack:
        pytest.fail("the 0 -> 1 test did not get a pool to 1", pytrace=False)
    kube, ms = stack["kube"], stack["measurements"]
    stack["load"].cancel()
    t0 = time.monotonic()
    wait_for("both pools back at 0 replicas", lambda: _pool_replicas(kube) == {"a10g": 0, "l40s": 0},
             SCALE_TO_ZERO_S + 120)
    t_zero = time.monotonic() - t0
    wait_for("worker pods gone", lambda: not kube.list("v1", "Pod", NS, "tideserve.io/component=worker"), 120)
    wait_for("Karpenter's nodes and NodeClaims removed (consolidation of empty nodes)", lambda: not kube.list(
        "karpenter.sh/v1", "NodeClaim") and not [n for n in kube.list("v1", "Node")
                                                 if n["metadata"]["labels"].get("karpenter.sh/nodepool")], 240)
    ms.append(f"requests cancelled -> replicas 0: {t_zero:.1f}s (cooldown {SCALE_TO_ZERO_S}s); "
              f"-> nodes consolidated: {time.monotonic() - t0:.1f}s (consolidateAfter {CONSOLIDATE_AFTER_S}s)")


# -- 4. delete ---------------------------------------------------------------------------------
def test_deleting_the_endpoint_removes_everything_it_owned(stack):
    kube = stack["kube"]
    assert kube.delete("tideserve.io/v1alpha1", "InferenceEndpoint", EP, NS)
    wait_for("the InferenceEndpoint gone (operator's finalizer done)",
             lambda: kube.get("tideserve.io/v1alpha1", "InferenceEndpoint", EP, NS) is None, 120)

    def leftovers():
        left = []
        for (api, kind) in [*EXPECTED, ("v1", "Secret"), ("apps/v1", "ReplicaSet"), ("v1", "Pod")]:
            left += [f"{kind}/{i['metadata']['name']}" for i in kube.list(api, kind, NS)
                     if i["metadata"].get("labels", {}).get("tideserve.io/endpoint") == EP
                     or any(o.get("uid") == stack.get("uid") for o in i["metadata"].get("ownerReferences") or [])]
        left += [f"PersistentVolume/{p['metadata']['name']}" for p in kube.list("v1", "PersistentVolume", None, SELECTOR)]
        left += [f"HPA/{h['metadata']['name']}" for h in kube.list("autoscaling/v2", "HorizontalPodAutoscaler", NS)]
        return left
    wait_for("no object of the endpoint left", lambda: not leftovers() or None, 180)
    assert stack["operator"].alive(), "the operator exited:\n" + stack["operator"].tail()
