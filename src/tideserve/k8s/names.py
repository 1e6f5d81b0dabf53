"""Object names and ports shared by the renderers, the gateway's Kubernetes mode and the operator.

One place so a Deployment, its Service, the ScaledObject and the gateway's discovery agree.
"""

from __future__ import annotations

from tideserve import __version__

#: The image the gateway, workers and operator run by default: this package's version.
DEFAULT_IMAGE = f"ghcr.io/tideserve/tideserve:{__version__}"

GROUP = "tideserve.io"
VERSION = "v1alpha1"
PLURAL = "inferenceendpoints"
KIND = "InferenceEndpoint"
FIELD_MANAGER = "tideserve"
# Owns a KEDA-scaled Deployment's spec.replicas from its creation on (set once, never applied
# again): KEDA and its HPA change it afterwards and every later apply leaves it out.
INITIAL_REPLICAS_MANAGER = "tideserve-initial-replicas"
ANNOTATION_REPLICAS = "tideserve.io/replicas"  # "initial": spec.replicas is applied at creation only

WORKER_PORT = 8000  # worker HTTP (APIs, /metrics)
GATEWAY_PORT = 8080  # gateway HTTP (APIs, /admin, /metrics)
SCALER_PORT = 9090  # gateway gRPC, KEDA external scaler

LABEL_ENDPOINT = "tideserve.io/endpoint"
LABEL_POOL = "tideserve.io/pool"
LABEL_COMPONENT = "tideserve.io/component"  # gateway | worker
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_NAME = "app.kubernetes.io/name"  # always "tideserve"

PRIORITY_CLASS_INFERENCE = "tideserve-inference"  # rendered by tideserve.k8s.cluster
PRIORITY_CLASS_TRAINING = "training"


def worker_name(endpoint: str, pool: str) -> str:
    """Deployment, headless Service, ScaledObject and PDB of one pool: ``<endpoint>-<pool>``."""
    return f"{endpoint}-{pool}"


def gateway_name(endpoint: str) -> str:
    """Gateway Deployment and its LoadBalancer Service (HTTP only): ``<endpoint>-gateway``."""
    return f"{endpoint}-gateway"


def scaler_name(endpoint: str) -> str:
    """The gateway's ClusterIP Service for the KEDA external scaler (gRPC), kept off the load
    balancer so that only the cluster reaches it: ``<endpoint>-scaler``."""
    return f"{endpoint}-scaler"


def config_name(endpoint: str) -> str:
    """ConfigMap holding the endpoint YAML (``endpoint.yaml``) and the worker's local config."""
    return f"{endpoint}-config"


def token_secret_name(endpoint: str) -> str:
    """Secret (key ``token``) the operator creates; workers accept only callers sending it."""
    return f"{endpoint}-worker-token"


def model_volume_name(endpoint: str, namespace: str) -> str:
    """PersistentVolume (cluster-scoped, hence the namespace in it) of an S3/FSx model source;
    its claim in the namespace is ``<endpoint>-model``."""
    return f"{namespace}-{endpoint}-model"


def worker_dns(endpoint: str, pool: str, namespace: str) -> str:
    """The pool's headless Service DNS name; it resolves to the pool's ready pods."""
    return f"{worker_name(endpoint, pool)}.{namespace}.svc"


def scaler_address(endpoint: str, namespace: str) -> str:
    """``host:port`` KEDA dials for the external scaler: the in-cluster scaler Service."""
    return f"{scaler_name(endpoint)}.{namespace}.svc:{SCALER_PORT}"
