"""The InferenceEndpoint resource: pydantic models and YAML loading."""

from tideserve.spec.load import load_endpoint, load_local_config, load_model_text
from tideserve.spec.local import LocalConfig, RestartPolicy
from tideserve.spec.models import (
    GPU_COMPUTE_CAPABILITY,
    Autoscaling,
    Batching,
    Decoding,
    EndpointSpec,
    GatewaySpec,
    InferenceEndpoint,
    ModelSpec,
    Pool,
    Replicas,
    Target,
)

__all__ = [
    "GPU_COMPUTE_CAPABILITY",
    "Autoscaling",
    "Batching",
    "Decoding",
    "EndpointSpec",
    "GatewaySpec",
    "InferenceEndpoint",
    "LocalConfig",
    "ModelSpec",
    "Pool",
    "Replicas",
    "RestartPolicy",
    "Target",
    "load_endpoint",
    "load_local_config",
    "load_model_text",
]
