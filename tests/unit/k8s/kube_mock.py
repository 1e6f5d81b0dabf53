"""A kmock Kubernetes API server on loopback for the operator tests, and polling helpers.

kmock's KubernetesEmulator keeps objects in memory and serves list/watch/get/create/patch/delete
like an API server, merging patches as plain dicts. Server-side apply creates objects that do
not exist yet (a PATCH the emulator answers with 404), so :class:`ApplyingEmulator` turns an
``application/apply-patch+yaml`` PATCH of a missing object into an upsert.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import attrs
import kmock
import yaml

APPLY_CONTENT_TYPE = "application/apply-patch+yaml"

# group/version/plural -> (kind, namespaced, subresources): what the mock's discovery serves.
RESOURCES: dict[str, tuple[str, bool, tuple[str, ...]]] = {
    "tideserve.io/v1alpha1/inferenceendpoints": ("InferenceEndpoint", True, ("status",)),
    "v1/pods": ("Pod", True, ("status",)),
    "v1/secrets": ("Secret", True, ()),
    "v1/services": ("Service", True, ("status",)),
    "v1/configmaps": ("ConfigMap", True, ()),
    "v1/serviceaccounts": ("ServiceAccount", True, ()),
    "v1/persistentvolumeclaims": ("PersistentVolumeClaim", True, ()),
    "v1/persistentvolumes": ("PersistentVolume", False, ()),
    "v1/events": ("Event", True, ()),
    "v1/namespaces": ("Namespace", False, ()),
    "apps/v1/deployments": ("Deployment", True, ("status", "scale")),
    "policy/v1/poddisruptionbudgets": ("PodDisruptionBudget", True, ("status",)),
    "keda.sh/v1alpha1/scaledobjects": ("ScaledObject", True, ("status",)),
    "monitoring.coreos.com/v1/podmonitors": ("PodMonitor", True, ()),
    "monitoring.coreos.com/v1/servicemonitors": ("ServiceMonitor", True, ()),
    "scheduling.k8s.io/v1/priorityclasses": ("PriorityClass", False, ()),
    "apiextensions.k8s.io/v1/customresourcedefinitions": ("CustomResourceDefinition", False, ()),
}
VERBS = ("list", "watch", "get", "create", "patch", "update", "delete")


@attrs.define(kw_only=True)
class ApplyingEmulator(kmock.KubernetesEmulator):
    """KubernetesEmulator + server-side apply of objects that do not exist yet (upsert), and
    list/watch resource versions: a list answers with the current write counter and a watch from
    that version replays only objects written since (kmock's emulator replays every object, so a
    client would see each existing object twice, as a real API server never shows it)."""

    _writes: int = attrs.field(default=0, init=False)
    _written_at: dict[tuple[Any, Any, Any], int] = attrs.field(factory=dict, init=False)

    async def _handle(self, request: kmock.Request) -> Any:
        ctype = (request.headers.get("Content-Type") or "").split(";")[0].strip()
        if (request.method == "PATCH" and ctype == APPLY_CONTENT_TYPE and request.resource is not None
                and request.name is not None and isinstance(request.data, dict)):
            key = (request.resource, request.namespace, request.name)
            async with self._lock:
                if key not in self.objects:
                    self.objects[key] = request.data
                elif self.objects[key].deleted:
                    self.objects[key].create(request.data)
        if request.resource is not None and request.action in (kmock.action.CREATE, kmock.action.UPDATE,
                                                               kmock.action.DELETE):
            meta = (request.data or {}).get("metadata", {}) if isinstance(request.data, dict) else {}
            key = (request.resource, request.namespace or meta.get("namespace"), request.name or meta.get("name"))
            self._writes += 1
            self._written_at[key] = self._writes
        return await super()._handle(request)

    async def _serve_list(self, request: kmock.Request) -> Any:
        result = await super()._serve_list(request)
        result["metadata"]["resourceVersion"] = str(self._writes)
        return result

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[Any]:
        since = request.params.get("resourceVersion", "")
        since_n = int(since) if since.isdigit() else -1
        async for event in super()._serve_watch(request):
            if isinstance(event, dict) and since_n >= 0:
                meta = (event.get("object") or {}).get("metadata") or {}
                key = (request.resource, meta.get("namespace"), meta.get("name"))
                if self._written_at.get(key, 0) <= since_n:
                    continue  # already in the list the client made
            yield event


def declare_resources(mock: kmock.KubernetesEmulator) -> None:
    for key, (kind, namespaced, subresources) in RESOURCES.items():
        mock.resources[key] = kmock.ResourceInfo(kind=kind, namespaced=namespaced, verbs=VERBS,
                                                 subresources=subresources)


def write_kubeconfig(path: Path, server: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "mock",
        "clusters": [{"name": "mock", "cluster": {"server": server}}],
        "users": [{"name": "mock", "user": {"token": "mock-token"}}],
        "contexts": [{"name": "mock", "context": {"cluster": "mock", "user": "mock"}}],
    }))
    return path


async def until(what: str, check: Callable[[], Any], timeout_s: float = 60.0) -> Any:
    """Poll ``check`` until it returns something truthy, at most ``timeout_s``; return it.

    The bound is a safety net for an event (the operator reacting), not a speed requirement:
    kopf in a thread of a busy 2-core machine took over 10 s to process a delete."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def mock_server() -> AsyncIterator[ApplyingEmulator]:
    async with ApplyingEmulator() as mock, kmock.Server(mock):
        declare_resources(mock)
        yield mock
