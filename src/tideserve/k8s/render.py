"""Pure renderers: an InferenceEndpoint -> the Kubernetes objects that run it (plain dicts).

``render_endpoint(endpoint, options)`` returns, in apply order:

| object | per | what for |
| --- | --- | --- |
| ConfigMap ``<ep>-config`` | endpoint | ``endpoint.yaml`` (mounted at /etc/tideserve/endpoint.yaml) and the worker's local config |
| PersistentVolume + PersistentVolumeClaim | endpoint (s3://, file://) | the model, read-only (Mountpoint for S3 / FSx for Lustre CSI) |
| Service ``<ep>-<pool>`` (headless) | pool | the gateway finds a pool's *ready* pods by DNS |
| Service ``<ep>-gateway`` (LoadBalancer, AWS NLB) | endpoint | the HTTP entry point |
| Service ``<ep>-scaler`` (ClusterIP) | endpoint | the KEDA external scaler (gRPC), in-cluster only |
| Deployment ``<ep>-gateway`` | endpoint | ``tideserve gateway`` |
| Deployment ``<ep>-<pool>`` | pool | workers pinned to the pool's GPU type and capacity types |
| PodDisruptionBudget ``<ep>-<pool>`` | pool | at most one replica voluntarily disrupted at a time |
| ScaledObject ``<ep>-<pool>`` | pool | KEDA scales the pool from the gateway's scaler (min may be 0) |
| PodMonitor / ServiceMonitor | endpoint | Prometheus operator scrapes workers and gateway |

No Kubernetes client is imported here; the operator applies what this returns. The worker-token
Secret ``<ep>-worker-token`` (key ``token``) is *referenced* (optional env var), never rendered:
a random token cannot be rendered deterministically, so the operator creates it.

Worker pods follow the restricted Pod Security Standard (kubernetes.io docs, "Pod Security
Standards": non-root, no privilege escalation, all capabilities dropped, RuntimeDefault seccomp;
writable paths are emptyDirs under a read-only root filesystem).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any

import yaml

from tideserve.errors import SpecError
from tideserve.k8s import names
from tideserve.spec.models import _DNS_LABEL, GPU_COMPUTE_CAPABILITY, InferenceEndpoint, Pool

#: ``karpenter.k8s.aws/instance-gpu-name`` value of each accelerator, as Karpenter labels nodes
#: (the EC2 GPU name in lower case: g5 -> a10g, g6 -> l4, g6e -> l40s, p4d -> a100, p5 -> h100,
#: p5e/p5en -> h200; Karpenter docs, "Well-known labels").
KARPENTER_GPU_NAME: dict[str, str] = {
    "a10g": "a10g",
    "l4": "l4",
    "l40s": "l40s",
    "a100": "a100",
    "h100": "h100",
    "h200": "h200",
}

GPU_RESOURCE = "nvidia.com/gpu"
LABEL_GPU_NAME = "karpenter.k8s.aws/instance-gpu-name"
LABEL_CAPACITY_TYPE = "karpenter.sh/capacity-type"
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
CONFIG_HASH_ANNOTATION = "tideserve.io/config-sha256"

CONFIG_DIR = "/etc/tideserve"
ENDPOINT_FILE = f"{CONFIG_DIR}/endpoint.yaml"
WORKER_CONFIG_FILE = f"{CONFIG_DIR}/worker-config.yaml"
CACHE_DIR = "/var/cache/tideserve"
S3_MOUNT_PATH = "/models"
HF_CACHE = f"{CACHE_DIR}/hf"


@dataclass(frozen=True)
class RenderOptions:
    """Cluster facts an endpoint spec does not hold.

    ``image``: the tideserve image (deploy/docker/Dockerfile, cpu target); GPU pools run
    ``gpu_image``, by default ``image``'s tag with ``-cuda`` appended (the cuda target).
    ``fsx_*``: the FSx for Lustre file system a ``file://`` source lies on (needed only then).
    ``s3_region``: the bucket's region for Mountpoint (optional).
    ``scaler_address``: ``host:port`` KEDA dials for every ScaledObject's external scaler, in
    place of the endpoint's in-cluster scaler Service (a scaler outside the cluster, e.g. a
    ``tideserve gateway`` on loopback next to an out-of-cluster KEDA, as tests/k8s runs it).
    Sizes are Kubernetes quantities. Times are seconds.
    """

    namespace: str = "default"
    image: str = names.DEFAULT_IMAGE
    gpu_image: str | None = None
    image_pull_policy: str = "IfNotPresent"
    run_as_user: int = 10001
    worker_cpu: str = "2"
    worker_memory: str = "8Gi"
    gateway_cpu: str = "500m"
    gateway_memory: str = "512Mi"
    gateway_replicas: int = 1
    load_balancer_scheme: str = "internal"  # or internet-facing
    cache_size: str = "20Gi"
    model_volume_size: str = "100Gi"  # required by PV/PVC; the S3 and FSx drivers ignore it
    s3_region: str | None = None
    fsx_file_system_id: str | None = None
    fsx_dns_name: str | None = None
    fsx_mount_name: str | None = None
    fsx_mount_path: str = "/fsx"
    prestop_sleep_s: int = 5
    termination_margin_s: int = 15
    model_load_timeout_s: int = 900
    scrape_interval_s: int = 15
    scaler_address: str | None = None


# -- helpers ------------------------------------------------------------------------------------------


def _labels(endpoint: str, component: str, pool: str | None = None) -> dict[str, str]:
    out = {
        names.LABEL_NAME: "tideserve",
        names.LABEL_MANAGED_BY: names.FIELD_MANAGER,
        names.LABEL_ENDPOINT: endpoint,
        names.LABEL_COMPONENT: component,
    }
    if pool is not None:
        out[names.LABEL_POOL] = pool
    return out


def _selector(endpoint: str, component: str, pool: str | None = None) -> dict[str, str]:
    out = {names.LABEL_ENDPOINT: endpoint, names.LABEL_COMPONENT: component}
    if pool is not None:
        out[names.LABEL_POOL] = pool
    return out


def _meta(name: str, namespace: str | None, labels: dict[str, str], annotations: dict | None = None) -> dict:
    m: dict[str, Any] = {"name": name, "labels": labels}
    if namespace is not None:
        m["namespace"] = namespace
    if annotations:
        m["annotations"] = annotations
    return m


def gpu_image(options: RenderOptions) -> str:
    """Image of GPU pools: ``gpu_image``, else the CUDA build of ``image`` by the Dockerfile's tag
    convention (``repo:0.1.0`` -> ``repo:0.1.0-cuda``, untagged ``repo`` -> ``repo:cuda``); an image
    pinned by digest cannot be derived and is used as is."""
    if options.gpu_image:
        return options.gpu_image
    if "@" in options.image:
        return options.image
    repo, sep, tag = options.image.rpartition(":")
    if sep and "/" not in tag:
        return f"{repo}:{tag}-cuda"
    return f"{options.image}:cuda"


def grace_period_s(endpoint: InferenceEndpoint, options: RenderOptions) -> int:
    """terminationGracePeriodSeconds: the preStop sleep, then a drain as long as the longest
    request (``gateway.request_timeout_s``), plus ``termination_margin_s`` for the exit."""
    return options.prestop_sleep_s + math.ceil(endpoint.spec.gateway.request_timeout_s) + options.termination_margin_s


def check_pool(index: int, pool: Pool) -> None:
    """Raise SpecError when a pool's engine target cannot run on its accelerator, so that an
    engine for one compute capability is never scheduled onto a node of another (sm_86 on
    sm_89). Compute capabilities: NVIDIA's CUDA GPUs table (developer.nvidia.com/cuda-gpus)."""
    t = pool.parsed_target
    path = f"spec.pools[{index}].target"
    if pool.accelerator == "cpu":
        if t.device != "cpu":
            raise SpecError(f"pool '{pool.name}' cannot be rendered:", [(
                path, f"{pool.target} is a CUDA engine but the pool's accelerator is cpu; "
                "name the GPU model in accelerator or use a cpu-<isa>-<compute type> target")])
        return
    sm = GPU_COMPUTE_CAPABILITY[pool.accelerator]
    if t.device != "cuda" or t.arch != sm:
        compute = t.compute_type if t.device == "cuda" else "fp16"
        raise SpecError(f"pool '{pool.name}' cannot be rendered:", [(
            path, f"{pool.target} is not an engine for {pool.accelerator} (sm_{sm[2:]}): its pods would be "
            f"pinned to {pool.accelerator} nodes that cannot run it; set target: cuda-{sm}-{compute} "
            f"or an accelerator of {t.arch if t.device == 'cuda' else 'type cpu'}")])


def _check_options(options: RenderOptions) -> None:
    problems = []
    if not re.fullmatch(_DNS_LABEL, options.namespace):
        problems.append(("namespace", f"'{options.namespace}' is not a namespace name (a DNS label: lower case, digits, '-')"))
    if options.load_balancer_scheme not in ("internal", "internet-facing"):
        problems.append(("load_balancer_scheme", f"'{options.load_balancer_scheme}' must be internal or internet-facing"))
    if not options.image or any(ch.isspace() for ch in options.image):
        problems.append(("image", f"'{options.image}' is not an image reference"))
    if problems:
        raise SpecError("render options are invalid:", problems)


def _check_names(endpoint: InferenceEndpoint) -> None:
    ep = endpoint.metadata.name
    too_long = [n for n in [names.gateway_name(ep), names.scaler_name(ep), names.config_name(ep),
                            names.token_secret_name(ep)] + [names.worker_name(ep, p.name) for p in endpoint.spec.pools]
                if len(n) > 63]
    if too_long:
        raise SpecError(f"endpoint '{ep}' cannot be rendered:", [
            ("metadata.name", f"object name '{n}' is longer than 63 characters (a DNS label, needed for Services); "
             "shorten the endpoint or pool name") for n in too_long])


# -- model source ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _ModelMount:
    objects: list[dict]
    volumes: list[dict]
    mounts: list[dict]
    init: list[dict]
    worker_args: list[str]
    env: list[dict]
    allowed_file_roots: list[str]


def _pv_pvc(endpoint: InferenceEndpoint, options: RenderOptions, csi: dict, mount_options: list[str]) -> list[dict]:
    ep, ns = endpoint.metadata.name, options.namespace
    pv_name, claim = names.model_volume_name(ep, ns), f"{ep}-model"
    labels = _labels(ep, "model")
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": _meta(pv_name, None, labels),
        "spec": {
            "capacity": {"storage": options.model_volume_size},
            "accessModes": ["ReadOnlyMany"],
            "persistentVolumeReclaimPolicy": "Retain",  # never delete the model data
            "storageClassName": "",  # static provisioning
            "claimRef": {"namespace": ns, "name": claim},
            "mountOptions": mount_options,
            "csi": csi,
        },
    }
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _meta(claim, ns, labels),
        "spec": {
            "accessModes": ["ReadOnlyMany"],
            "storageClassName": "",
            "volumeName": pv_name,
            "resources": {"requests": {"storage": options.model_volume_size}},
        },
    }
    return [pv, pvc]


def _model_mount(endpoint: InferenceEndpoint, options: RenderOptions) -> _ModelMount:
    """Volumes, mounts and worker arguments for the model source's scheme:

    - ``s3://bucket/prefix``: Mountpoint for Amazon S3 CSI driver (``s3.csi.aws.com``), the
      prefix mounted read-only at /models, readable by the non-root user (``allow-other``, uid/gid);
    - ``file:///fsx/...``: FSx for Lustre CSI driver (``fsx.csi.aws.com``), the file system
      mounted at ``fsx_mount_path``; needs ``fsx_file_system_id``, ``fsx_dns_name``, ``fsx_mount_name``;
    - ``hf://``: an init container fetches the snapshot into the pod's cache volume, the worker
      then reads it offline;
    - ``pkg://``: the model ships inside the image (an installed package): nothing to mount or fetch.
    """
    source = endpoint.spec.model.source
    scheme, _, rest = source.partition("://")
    model_vol = {"name": "model", "persistentVolumeClaim": {"claimName": f"{endpoint.metadata.name}-model", "readOnly": True}}
    uid = str(options.run_as_user)
    if scheme == "s3":
        bucket, _, prefix = rest.partition("/")
        opts = ["read-only", "allow-other", f"uid={uid}", f"gid={uid}"]
        if prefix.strip("/"):
            opts.append(f"prefix {prefix.strip('/')}/")
        if options.s3_region:
            opts.append(f"region {options.s3_region}")
        csi: dict[str, Any] = {"driver": "s3.csi.aws.com",
               "volumeHandle": names.model_volume_name(endpoint.metadata.name, options.namespace),
               "volumeAttributes": {"bucketName": bucket}}
        return _ModelMount(_pv_pvc(endpoint, options, csi, opts), [model_vol],
                           [{"name": "model", "mountPath": S3_MOUNT_PATH, "readOnly": True}], [],
                           ["--model-dir", S3_MOUNT_PATH], [], [])
    if scheme == "file":
        path = "/" + rest.lstrip("/")
        root = options.fsx_mount_path.rstrip("/")
        if not path.startswith(root + "/"):
            raise SpecError("the model source cannot be rendered for Kubernetes:", [(
                "spec.model.source", f"{source} is not under the FSx for Lustre mount path {root}/; on Kubernetes a "
                f"file:// source must lie on FSx (file://{root}/...), or use s3:// or hf://")])
        missing = [flag for flag, v in (("fsx_file_system_id (--fsx-file-system-id)", options.fsx_file_system_id),
                                        ("fsx_dns_name (--fsx-dns-name)", options.fsx_dns_name),
                                        ("fsx_mount_name (--fsx-mount-name)", options.fsx_mount_name)) if not v]
        if missing:
            raise SpecError("the model source cannot be rendered for Kubernetes:", [(
                "spec.model.source", f"{source} lies on FSx for Lustre; give the file system's "
                f"{', '.join(missing)} (aws fsx describe-file-systems shows them)")])
        csi = {"driver": "fsx.csi.aws.com", "volumeHandle": options.fsx_file_system_id,
               "volumeAttributes": {"dnsname": options.fsx_dns_name, "mountname": options.fsx_mount_name}}
        return _ModelMount(_pv_pvc(endpoint, options, csi, ["flock"]), [model_vol],
                           [{"name": "model", "mountPath": root, "readOnly": True}], [],
                           ["--model-dir", path], [], [root])
    if scheme == "hf":
        env = [{"name": "HF_HUB_CACHE", "value": HF_CACHE}]
        init = {
            "name": "fetch-model",
            "command": ["python", "-m", "tideserve.sources", source, "--cache-dir", CACHE_DIR],
            "env": env,
        }
        return _ModelMount([], [], [], [init], [], [*env, {"name": "HF_HUB_OFFLINE", "value": "1"}], [])
    return _ModelMount([], [], [], [], [], [], [])


# -- objects ------------------------------------------------------------------------------------------


def _config_map(endpoint: InferenceEndpoint, options: RenderOptions, mount: _ModelMount) -> dict:
    ep = endpoint.metadata.name
    spec_yaml = yaml.safe_dump(endpoint.model_dump(by_alias=True, mode="json"), sort_keys=True)
    worker_cfg = yaml.safe_dump({"cache_dir": CACHE_DIR, "allowed_file_roots": mount.allowed_file_roots}, sort_keys=True)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(names.config_name(ep), options.namespace, _labels(ep, "config")),
        "data": {"endpoint.yaml": spec_yaml, "worker-config.yaml": worker_cfg},
    }


def _pod_security(options: RenderOptions) -> dict:
    return {
        "runAsNonRoot": True,
        "runAsUser": options.run_as_user,
        "runAsGroup": options.run_as_user,
        "fsGroup": options.run_as_user,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _container_security() -> dict:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _http_probe(path: str, port: str, period_s: int, failures: int, timeout_s: int = 5) -> dict:
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": period_s, "failureThreshold": failures,
            "timeoutSeconds": timeout_s}


def _ready_exec_probe(period_s: int, failures: int, timeout_s: int = 5) -> dict:
    """The worker's readiness: ``/v2/health/ready`` asked with the worker token, which an
    ``httpGet`` probe cannot carry (tideserve.worker.probe)."""
    return {"exec": {"command": ["python", "-m", "tideserve.worker.probe", "--port", str(names.WORKER_PORT),
                                 "--timeout-s", str(max(1, timeout_s - 1))]},
            "periodSeconds": period_s, "failureThreshold": failures, "timeoutSeconds": timeout_s}


def _common_env(endpoint: InferenceEndpoint) -> list[dict]:
    return [
        {"name": "HOME", "value": "/tmp"},
        {"name": "XDG_CACHE_HOME", "value": CACHE_DIR},
        {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "TIDESERVE_WORKER_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": names.token_secret_name(endpoint.metadata.name), "key": "token", "optional": True}}},
    ]


def _base_volumes(endpoint: InferenceEndpoint, options: RenderOptions) -> list[dict]:
    return [
        {"name": "config", "configMap": {"name": names.config_name(endpoint.metadata.name)}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
        {"name": "cache", "emptyDir": {"sizeLimit": options.cache_size}},
    ]


_BASE_MOUNTS = [
    {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
    {"name": "tmp", "mountPath": "/tmp"},
    {"name": "cache", "mountPath": CACHE_DIR},
]


def _worker_deployment(endpoint: InferenceEndpoint, pool: Pool, options: RenderOptions, mount: _ModelMount,
                       config_hash: str) -> dict:
    ep, ns = endpoint.metadata.name, options.namespace
    name = names.worker_name(ep, pool.name)
    gpu = pool.accelerator != "cpu"
    image = gpu_image(options) if gpu else options.image
    grace = grace_period_s(endpoint, options)
    resources: dict[str, dict[str, Any]] = {
        "requests": {"cpu": options.worker_cpu, "memory": options.worker_memory},
        "limits": {"memory": options.worker_memory},
    }
    if gpu:  # one GPU per replica; extended resources need requests == limits
        resources["requests"][GPU_RESOURCE] = 1
        resources["limits"][GPU_RESOURCE] = 1
    args = [
        "--endpoint", ENDPOINT_FILE, "--pool", pool.name, "--replica-id", "$(POD_NAME)",
        "--config", WORKER_CONFIG_FILE, "--host", "0.0.0.0", "--port", str(names.WORKER_PORT),
        "--drain-timeout-s", str(math.ceil(endpoint.spec.gateway.request_timeout_s)), "--log-format", "json",
        *mount.worker_args,
    ]
    container = {
        "name": "worker",
        "image": image,
        "imagePullPolicy": options.image_pull_policy,
        "command": ["python", "-m", "tideserve.worker"],
        "args": args,
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                *_common_env(endpoint), *mount.env],
        "ports": [{"name": "http", "containerPort": names.WORKER_PORT, "protocol": "TCP"}],
        # Ready only once the model is loaded (the worker answers 503 before, and while draining).
        # Every route but liveness needs the worker token, so readiness is an exec probe.
        "readinessProbe": _ready_exec_probe(5, 2),
        # Liveness and readiness wait until the model has loaded once, up to model_load_timeout_s.
        "startupProbe": _ready_exec_probe(10, max(1, math.ceil(options.model_load_timeout_s / 10))),
        "livenessProbe": _http_probe("/v2/health/live", "http", 10, 3),
        # The sleep lets endpoint removal reach the gateway's DNS view before SIGTERM starts the drain.
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(options.prestop_sleep_s)]}}},
        "resources": resources,
        "securityContext": _container_security(),
        "volumeMounts": [*_BASE_MOUNTS, *mount.mounts],
    }
    init = [{
        **c,
        "image": image,
        "imagePullPolicy": options.image_pull_policy,
        "env": [*_common_env(endpoint)[:4], *c["env"]],
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
        "securityContext": _container_security(),
        "volumeMounts": list(_BASE_MOUNTS),
    } for c in mount.init]
    pod_spec: dict[str, Any] = {
        "priorityClassName": names.PRIORITY_CLASS_INFERENCE,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": grace,
        "securityContext": _pod_security(options),
        "containers": [container],
        "volumes": [*_base_volumes(endpoint, options), *mount.volumes],
    }
    if init:
        pod_spec["initContainers"] = init
    if gpu:
        pod_spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{
            "matchExpressions": [
                {"key": LABEL_GPU_NAME, "operator": "In", "values": [KARPENTER_GPU_NAME[pool.accelerator]]},
                {"key": LABEL_CAPACITY_TYPE, "operator": "In", "values": sorted(set(pool.capacity_types))},
            ]}]}}}
        pod_spec["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(name, ns, _labels(ep, "worker", pool.name),
                          {"tideserve.io/target": pool.target, "tideserve.io/accelerator": pool.accelerator,
                           names.ANNOTATION_REPLICAS: "initial"}),
        "spec": {
            # The count at creation only (the applier sets it once, see apply.py): KEDA's HPA owns
            # it afterwards and server-side apply must not fight it. Without it a new Deployment
            # starts at 1 and Karpenter launches a GPU node for a min-0 pool before KEDA zeroes it.
            "replicas": pool.replicas.min,
            "selector": {"matchLabels": _selector(ep, "worker", pool.name)},
            "revisionHistoryLimit": 3,
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {
                    "labels": _labels(ep, "worker", pool.name),
                    "annotations": {
                        # Karpenter must not consolidate a node under a loading pod; the operator removes
                        # this from a pod once it is Ready.
                        DO_NOT_DISRUPT: "true",
                        CONFIG_HASH_ANNOTATION: config_hash,
                    },
                },
                "spec": pod_spec,
            },
        },
    }


def _inference_grpc_port(endpoint: InferenceEndpoint, key: str) -> list[dict]:
    """The gateway's KServe v2 / Triton gRPC port (``spec.gateway.grpc_port``) as a container
    port (``key`` = containerPort) or a Service port (``key`` = port), or nothing when it is off."""
    port = endpoint.spec.gateway.grpc_port
    if port is None:
        return []
    out: dict[str, Any] = {"name": "infer-grpc", key: port, "protocol": "TCP"}
    if key == "port":
        out.update(targetPort="infer-grpc", appProtocol="grpc")
    return [out]


def _gateway_deployment(endpoint: InferenceEndpoint, options: RenderOptions, config_hash: str) -> dict:
    ep, ns = endpoint.metadata.name, options.namespace
    container = {
        "name": "gateway",
        "image": options.image,
        "imagePullPolicy": options.image_pull_policy,
        "command": ["tideserve", "gateway", ENDPOINT_FILE, "--namespace", ns, "--host", "0.0.0.0",
                    "--port", str(names.GATEWAY_PORT), "--scaler-port", str(names.SCALER_PORT)],
        "env": _common_env(endpoint),
        "ports": [{"name": "http", "containerPort": names.GATEWAY_PORT, "protocol": "TCP"},
                  {"name": "grpc", "containerPort": names.SCALER_PORT, "protocol": "TCP"},
                  *_inference_grpc_port(endpoint, "containerPort")],
        "readinessProbe": _http_probe("/v2/health/ready", "http", 5, 2),
        "livenessProbe": _http_probe("/v2/health/live", "http", 10, 3),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(options.prestop_sleep_s)]}}},
        "resources": {"requests": {"cpu": options.gateway_cpu, "memory": options.gateway_memory},
                      "limits": {"memory": options.gateway_memory}},
        "securityContext": _container_security(),
        "volumeMounts": list(_BASE_MOUNTS),
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(names.gateway_name(ep), ns, _labels(ep, "gateway")),
        "spec": {
            "replicas": options.gateway_replicas,
            "selector": {"matchLabels": _selector(ep, "gateway")},
            "revisionHistoryLimit": 3,
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": _labels(ep, "gateway"), "annotations": {CONFIG_HASH_ANNOTATION: config_hash}},
                "spec": {
                    "priorityClassName": names.PRIORITY_CLASS_INFERENCE,
                    "enableServiceLinks": False,
                    # Held and in-flight requests finish before the gateway exits.
                    "terminationGracePeriodSeconds": grace_period_s(endpoint, options),
                    "securityContext": _pod_security(options),
                    "containers": [container],
                    "volumes": _base_volumes(endpoint, options),
                },
            },
        },
    }


def _services(endpoint: InferenceEndpoint, options: RenderOptions) -> list[dict]:
    ep, ns = endpoint.metadata.name, options.namespace
    out = []
    for pool in endpoint.spec.pools:
        out.append({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(names.worker_name(ep, pool.name), ns, _labels(ep, "worker", pool.name)),
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": False,  # DNS lists only pods whose model is loaded
                "selector": _selector(ep, "worker", pool.name),
                "ports": [{"name": "http", "port": names.WORKER_PORT, "targetPort": "http", "protocol": "TCP"}],
            },
        })
    nlb = "service.beta.kubernetes.io/aws-load-balancer-"
    out.append({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(names.gateway_name(ep), ns, _labels(ep, "gateway"), {
            f"{nlb}type": "external",  # the AWS Load Balancer Controller provisions an NLB
            f"{nlb}nlb-target-type": "ip",
            f"{nlb}scheme": options.load_balancer_scheme,
            f"{nlb}healthcheck-protocol": "http",
            f"{nlb}healthcheck-path": "/v2/health/ready",
        }),
        "spec": {
            "type": "LoadBalancer",
            "selector": _selector(ep, "gateway"),
            "ports": [{"name": "http", "port": names.GATEWAY_PORT, "targetPort": "http", "protocol": "TCP"},
                      *_inference_grpc_port(endpoint, "port")],
        },
    })
    out.append({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(names.scaler_name(ep), ns, _labels(ep, "gateway")),
        "spec": {
            "type": "ClusterIP",
            "selector": _selector(ep, "gateway"),
            "ports": [{"name": "grpc", "port": names.SCALER_PORT, "targetPort": "grpc", "protocol": "TCP",
                       "appProtocol": "grpc"}],
        },
    })
    return out


def _pdb(endpoint: InferenceEndpoint, pool: Pool, options: RenderOptions) -> dict:
    ep = endpoint.metadata.name
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(names.worker_name(ep, pool.name), options.namespace, _labels(ep, "worker", pool.name)),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": _selector(ep, "worker", pool.name)},
            # A pod that never became ready (still loading, crash-looping) must not block a node drain.
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def _scaled_object(endpoint: InferenceEndpoint, pool: Pool, options: RenderOptions) -> dict:
    """KEDA ScaledObject of one pool. pollingInterval: the spec's ``autoscaling.interval_s``
    (KEDA's default is 30 s, which would add up to 30 s to a cold start); cooldownPeriod:
    ``autoscaling.scale_to_zero_after_s`` (KEDA applies it only to the last replica -> 0,
    keda.sh, ScaledObject specification). The HPA's own windows are zero and its rate limits wide: the gateway's
    scaler already reports what the autoscaler policy decided, stabilization included, and the
    HPA should reach that count in one step."""
    ep = endpoint.metadata.name
    a = endpoint.spec.autoscaling
    name = names.worker_name(ep, pool.name)
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": _meta(name, options.namespace, _labels(ep, "worker", pool.name)),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicaCount": pool.replicas.min,
            "maxReplicaCount": pool.replicas.max,
            "pollingInterval": max(1, math.ceil(a.interval_s)),
            "cooldownPeriod": math.ceil(a.scale_to_zero_after_s),
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
                "scaleUp": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max",
                            "policies": [{"type": "Pods", "value": pool.replicas.max, "periodSeconds": 15}]},
                "scaleDown": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max",
                              "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}]},
            }}},
            "triggers": [{
                "type": "external",
                "metadata": {"scalerAddress": options.scaler_address or names.scaler_address(ep, options.namespace),
                             "endpoint": ep,
                             "pool": pool.name},
            }],
        },
    }


def _pod_label_meta(label: str) -> str:
    """Prometheus's Kubernetes discovery label for pod label ``label``
    (``__meta_kubernetes_pod_label_<name>``, every character not [a-zA-Z0-9_] turned to ``_``)."""
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", label)


def _monitors(endpoint: InferenceEndpoint, options: RenderOptions) -> list[dict]:
    ep = endpoint.metadata.name
    interval = f"{options.scrape_interval_s}s"
    return [
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PodMonitor",
            "metadata": _meta(f"{ep}-workers", options.namespace, _labels(ep, "worker")),
            "spec": {
                "selector": {"matchLabels": _selector(ep, "worker")},
                # Workers answer /metrics only with their token (the operator's Secret), sent as a
                # Bearer credential.
                # The dashboard filters every series by endpoint and pool: workers' series get
                # them from their pod's labels (as the embedded mode's service discovery gives them).
                "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": interval,
                                         "authorization": {"type": "Bearer", "credentials": {
                                             "name": names.token_secret_name(ep), "key": "token"}},
                                         "relabelings": [
                                             {"sourceLabels": [_pod_label_meta(names.LABEL_ENDPOINT)],
                                              "targetLabel": "endpoint", "action": "replace"},
                                             {"sourceLabels": [_pod_label_meta(names.LABEL_POOL)],
                                              "targetLabel": "pool", "action": "replace"}]}],
            },
        },
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": _meta(names.gateway_name(ep), options.namespace, _labels(ep, "gateway")),
            "spec": {
                # Matches the LoadBalancer Service; the scaler Service has no "http" port, so no targets.
                "selector": {"matchLabels": _selector(ep, "gateway")},
                # honorLabels: the gateway's series carry their own endpoint and pool labels,
                # which must win over the operator's target label "endpoint" (the port name).
                "endpoints": [{"port": "http", "path": "/metrics", "interval": interval, "honorLabels": True}],
            },
        },
    ]


def render_endpoint(endpoint: InferenceEndpoint, options: RenderOptions = RenderOptions()) -> list[dict]:
    """Every object of one endpoint, in apply order (see the module docstring); deterministic:
    the same endpoint and options give equal output.

    Raises SpecError (with field paths) when the options are invalid (namespace, load balancer
    scheme, image), a pool's target does not match its accelerator's
    compute capability, an object name would exceed 63 characters, a ``file://`` source is
    not on FSx or the FSx options are missing, or ``spec.gateway.grpc_port`` is 0 or taken.
    """
    _check_options(options)
    for i, pool in enumerate(endpoint.spec.pools):
        check_pool(i, pool)
    _check_names(endpoint)
    grpc_port = endpoint.spec.gateway.grpc_port
    if grpc_port in (0, names.GATEWAY_PORT, names.SCALER_PORT):
        raise SpecError("the endpoint cannot be rendered for Kubernetes:", [(
            "spec.gateway.grpc_port", f"{grpc_port} is {'not a fixed port' if grpc_port == 0 else 'taken'} in the "
            f"gateway pod (HTTP {names.GATEWAY_PORT}, KEDA scaler {names.SCALER_PORT}); use e.g. 8001, Triton's")])
    mount = _model_mount(endpoint, options)
    cm = _config_map(endpoint, options, mount)
    config_hash = hashlib.sha256(json.dumps(cm["data"], sort_keys=True).encode()).hexdigest()[:16]
    pools = sorted(endpoint.spec.pools, key=lambda p: p.name)
    return [
        cm,
        *mount.objects,
        *_services(endpoint, options),
        _gateway_deployment(endpoint, options, config_hash),
        *[_worker_deployment(endpoint, p, options, mount, config_hash) for p in pools],
        *[_pdb(endpoint, p, options) for p in pools],
        *[_scaled_object(endpoint, p, options) for p in pools],
        *_monitors(endpoint, options),
    ]


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the endpoint YAML in the ConfigMap) as readable ``|`` blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value and all(line == line.rstrip() for line in value.splitlines()) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(objects: list[dict]) -> str:
    """Objects as one multi-document YAML text (keys sorted, so output is stable)."""
    return "".join("---\n" + yaml.dump(o, Dumper=_Dumper, sort_keys=True, width=120) for o in objects)
