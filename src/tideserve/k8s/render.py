"""Pure renderers: an InferenceEndpoint -> Kubernetes manifests (dicts). Placeholder: filled in."""

from __future__ import annotations

from dataclasses import dataclass

from tideserve.spec.models import InferenceEndpoint


@dataclass(frozen=True)
class RenderOptions:
    namespace: str = "default"
    image: str = "ghcr.io/tideserve/tideserve:0.1.0"


def render_endpoint(endpoint: InferenceEndpoint, options: RenderOptions = RenderOptions()) -> list[dict]:
    """Every object of one endpoint, in apply order. Raises SpecError when it cannot be rendered."""
    raise NotImplementedError
