"""A small REST client for the tests' API server (httpx, client certificate or bearer token):
what the assertions read back, independent of the operator's own client."""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Callable
from typing import Any, TypeVar

import httpx
import yaml

T = TypeVar("T")
CORE_KINDS_CLUSTER_SCOPED = {"Namespace", "Node", "PersistentVolume", "ClusterRole", "ClusterRoleBinding",
                             "CustomResourceDefinition", "PriorityClass", "APIService", "StorageClass"}


class KubeError(Exception):
    def __init__(self, method: str, path: str, status: int, text: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {text[:600]}")
        self.status = status


def wait_for(what: str, fn: Callable[[], T], timeout_s: float, interval_s: float = 0.5) -> T:
    """Call ``fn`` until it returns something truthy; AssertionError naming ``what`` (and the last
    value or error) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        try:
            value = fn()
            if value:
                return value
            last = value
        except (KubeError, httpx.HTTPError) as exc:
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what} (last: {str(last)[:800]})")
        time.sleep(interval_s)


class Kube:
    def __init__(self, server: str, ca: str, *, cert: tuple[str, str] | None = None, token: str | None = None,
                 timeout_s: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        ctx = ssl.create_default_context(cafile=ca)
        if cert:
            ctx.load_cert_chain(*cert)
        self.http = httpx.Client(base_url=server, verify=ctx, headers=headers, timeout=timeout_s)
        self._resources: dict[str, dict[str, dict]] = {}

    def close(self) -> None:
        self.http.close()

    # -- raw ------------------------------------------------------------------------------------
    def request(self, method: str, path: str, *, body: Any = None, params: dict | None = None,
                content_type: str = "application/json", ok404: bool = False) -> Any:
        content = None
        if body is not None:
            content = body if isinstance(body, (str, bytes)) else json.dumps(body)
        r = self.http.request(method, path, content=content, params=params,
                              headers={"Content-Type": content_type} if body is not None else None)
        if r.status_code == 404 and ok404:
            return None
        if r.status_code >= 400:
            raise KubeError(method, path, r.status_code, r.text)
        return r.json() if r.content else None

    # -- discovery and paths -------------------------------------------------------------------
    def resource(self, api_version: str, kind: str) -> dict:
        if kind not in self._resources.get(api_version, {}):
            base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            data = self.request("GET", base)
            self._resources[api_version] = {r["kind"]: r for r in data["resources"] if "/" not in r["name"]}
        return self._resources[api_version][kind]

    def path(self, api_version: str, kind: str, namespace: str | None = None, name: str | None = None) -> str:
        res = self.resource(api_version, kind)
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        ns = f"/namespaces/{namespace}" if res["namespaced"] and namespace else ""
        return f"{base}{ns}/{res['name']}" + (f"/{name}" if name else "")

    # -- verbs ----------------------------------------------------------------------------------
    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict | None:
        return self.request("GET", self.path(api_version, kind, namespace, name), ok404=True)

    def list(self, api_version: str, kind: str, namespace: str | None = None, selector: str | None = None) -> list[dict]:
        params = {"labelSelector": selector} if selector else None
        return self.request("GET", self.path(api_version, kind, namespace), params=params)["items"]

    def apply(self, obj: dict, manager: str = "tests", dry_run: bool = False) -> dict:
        meta = obj["metadata"]
        path = self.path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
        params = {"fieldManager": manager, "force": "true", **({"dryRun": "All"} if dry_run else {})}
        return self.request("PATCH", path, body=yaml.safe_dump(obj), params=params,
                            content_type="application/apply-patch+yaml")

    def apply_all(self, docs: list[dict], manager: str = "tests") -> None:
        for d in docs:
            if d:
                self.apply(d, manager)

    def create(self, obj: dict) -> dict:
        meta = obj["metadata"]
        return self.request("POST", self.path(obj["apiVersion"], obj["kind"], meta.get("namespace")), body=obj)

    def merge_patch(self, api_version: str, kind: str, name: str, patch: dict, namespace: str | None = None,
                    subresource: str = "") -> dict:
        path = self.path(api_version, kind, namespace, name) + (f"/{subresource}" if subresource else "")
        return self.request("PATCH", path, body=patch, content_type="application/merge-patch+json")

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> bool:
        return self.request("DELETE", self.path(api_version, kind, namespace, name), ok404=True,
                            params={"propagationPolicy": "Background"}) is not None

    def wait_crd(self, name: str, timeout_s: float = 60.0) -> None:
        def established() -> bool:
            crd = self.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", name)
            return any(c["type"] == "Established" and c["status"] == "True"
                       for c in ((crd or {}).get("status") or {}).get("conditions") or [])
        wait_for(f"CRD {name} Established", established, timeout_s)
        group_version = None
        crd = self.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", name)
        for v in crd["spec"]["versions"]:
            if v.get("served"):
                group_version = f"{crd['spec']['group']}/{v['name']}"
        if group_version:
            self._resources.pop(group_version, None)
