"""Server-side apply of an endpoint's manifests, pruning, and the worker-token Secret.

The only module of tideserve that imports the ``kubernetes`` client (DESIGN.md, rule 2). It
talks to the API server through the client's generic request path, so any kind the cluster
serves works the same way, custom ones included (KEDA ScaledObject, PodMonitor...): the kind's
plural and scope come from API discovery (``GET /api/v1``, ``GET /apis/<group>/<version>``).

What one :func:`apply_endpoint` call does, in order:

1. Every rendered object gets the labels ``tideserve.io/endpoint=<endpoint>`` and
   ``app.kubernetes.io/managed-by=tideserve`` (names.py) and, when it is namespaced, the
   endpoint's namespace and a controller owner reference to the InferenceEndpoint, so the
   garbage collector deletes it with the endpoint. Owner references cannot point from a
   cluster-scoped object to a namespaced owner; cluster-scoped objects only carry the labels
   and are deleted by the operator's delete handler (:func:`delete_cluster_scoped`).
2. The Secret ``<endpoint>-worker-token`` (key ``token``, 32 random bytes, URL-safe base64)
   is created when absent and never written again, so re-applying never rotates it.
3. Each object is applied with ``PATCH ...?fieldManager=tideserve&force=true`` and
   ``Content-Type: application/apply-patch+yaml`` (server-side apply; Kubernetes docs,
   "Server-Side Apply"). ``force`` takes over fields another manager set (e.g. a human's
   ``kubectl edit``); the spec is the source of truth. A KEDA-scaled Deployment (annotated
   ``tideserve.io/replicas: initial``) gets its rendered ``spec.replicas`` (the pool's minimum)
   only when it is created; afterwards KEDA and its HPA own the field and it is left out.
4. Objects of this endpoint (found by the two labels) that the new render no longer has are
   deleted (e.g. a removed pool's Deployment, Service, ScaledObject and PDB). The kinds searched
   are those rendered now plus those the caller says were applied before (the operator keeps
   them in the endpoint's status), so a kind that disappears entirely is pruned too.

Errors: :class:`ApplyError` with the HTTP status, the object and the server's message, and a
``retryable`` flag (server errors, throttling, conflicts and kinds the cluster does not serve
yet are retryable; rejected objects are not).
"""

from __future__ import annotations

import base64
import copy
import json
import os
import secrets
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Iterable

import kubernetes.client
import kubernetes.config
import urllib3

from tideserve.errors import TideserveError
from tideserve.k8s import names

MANAGED_BY = names.FIELD_MANAGER  # the value of app.kubernetes.io/managed-by on every object
TOKEN_KEY = "token"
TOKEN_BYTES = 32
REQUEST_TIMEOUT_S = 30.0


class ApplyError(TideserveError):
    """A request to the API server failed.

    ``status`` is the HTTP status (0 when the server was not reached), ``retryable`` says
    whether the same request may succeed later with nothing changed on our side.
    """

    code = "apply_failed"

    def __init__(self, message: str, *, status: int = 0, retryable: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable


@dataclass(frozen=True)
class Owner:
    """The InferenceEndpoint that owns the objects: its name, namespace and uid."""

    name: str
    namespace: str
    uid: str

    def reference(self) -> dict[str, Any]:
        """The ownerReferences entry children carry (controller, blocks foreground deletion)."""
        return {
            "apiVersion": f"{names.GROUP}/{names.VERSION}", "kind": names.KIND,
            "name": self.name, "uid": self.uid, "controller": True, "blockOwnerDeletion": True,
        }

    def labels(self) -> dict[str, str]:
        return {names.LABEL_ENDPOINT: self.name, names.LABEL_MANAGED_BY: MANAGED_BY}

    def selector(self) -> str:
        """The label selector of every object of this endpoint."""
        return ",".join(f"{k}={v}" for k, v in self.labels().items())


@dataclass(frozen=True)
class Resource:
    """One kind as the API server serves it (from discovery)."""

    api_version: str  # "v1", "apps/v1", "keda.sh/v1alpha1"
    kind: str
    plural: str
    namespaced: bool

    def path(self, namespace: str | None, name: str | None = None) -> str:
        """The REST path of the collection (``name`` None) or of one object."""
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        return base + (f"/{name}" if name else "")


@dataclass(frozen=True, order=True)
class ObjectRef:
    """``(apiVersion, kind, namespace or None, name)`` of one object."""

    api_version: str
    kind: str
    namespace: str | None
    name: str

    def __str__(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind} {where}{self.name}"


@dataclass
class ApplyResult:
    """What one :func:`apply_endpoint` did. ``kinds`` are ``apiVersion/kind`` strings of every
    kind applied (to be passed back as ``previous_kinds`` next time)."""

    applied: list[ObjectRef] = field(default_factory=list)
    pruned: list[ObjectRef] = field(default_factory=list)
    token_created: bool = False
    kinds: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Connection:
    """What an HTTP client needs to reach the API server, with a fresh token (kopf's login)."""

    server: str
    ca_path: str | None = None
    insecure: bool = False
    scheme: str | None = None
    token: str | None = None
    certificate_path: str | None = None
    private_key_path: str | None = None


def load_configuration(kubeconfig: str | os.PathLike[str] | None = None,
                       context: str | None = None) -> kubernetes.client.Configuration:
    """The client configuration: ``kubeconfig`` (and ``context``) when given, else the pod's
    service account when running in a cluster, else ``$KUBECONFIG`` or ``~/.kube/config``.

    Raises ApplyError naming what was tried when none works. Tokens of exec plugins (EKS's
    ``aws eks get-token``) and of projected service-account files are refreshed by the client.
    """
    cfg = kubernetes.client.Configuration()
    try:
        if kubeconfig is not None:
            kubernetes.config.load_kube_config(config_file=str(kubeconfig), context=context,
                                               client_configuration=cfg)
            return cfg
        try:
            kubernetes.config.load_incluster_config(client_configuration=cfg)
            return cfg
        except kubernetes.config.ConfigException:
            kubernetes.config.load_kube_config(context=context, client_configuration=cfg)
            return cfg
    except (kubernetes.config.ConfigException, OSError, ValueError) as exc:
        where = kubeconfig or "the in-cluster service account, $KUBECONFIG or ~/.kube/config"
        raise ApplyError(f"cannot load Kubernetes credentials from {where}: {exc}; "
                         "pass --kubeconfig or run inside the cluster") from None


def _status_message(status: int, data: bytes) -> str:
    try:
        body = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return data[:300].decode(errors="replace")
    if isinstance(body, dict):
        return str(body.get("message") or body.get("reason") or body)[:500]
    return str(body)[:500]


class Cluster:
    """The API server, through the ``kubernetes`` client's generic request path.

    Methods are blocking (the operator runs them in kopf's thread pool).
    """

    def __init__(self, configuration: kubernetes.client.Configuration) -> None:
        self._cfg = configuration
        self._api = kubernetes.client.ApiClient(configuration)
        self._discovered: dict[str, dict[str, Resource]] = {}

    @classmethod
    def connect(cls, kubeconfig: str | os.PathLike[str] | None = None, context: str | None = None) -> Cluster:
        """A Cluster from :func:`load_configuration`. Raises ApplyError."""
        return cls(load_configuration(kubeconfig, context))

    def close(self) -> None:
        self._api.close()

    def connection(self) -> Connection:
        """The server address and current credentials (the token refreshed when it expired)."""
        header = (self._cfg.get_api_key_with_prefix("BearerToken", alias="authorization") or "").strip()
        parts = header.split(" ", 1) if header else []
        scheme, token = (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0] if parts else None)
        return Connection(
            server=self._cfg.host, ca_path=self._cfg.ssl_ca_cert, insecure=not self._cfg.verify_ssl,
            scheme=scheme, token=token, certificate_path=self._cfg.cert_file, private_key_path=self._cfg.key_file,
        )

    # -- raw requests -------------------------------------------------------------------------

    def request(self, method: str, path: str, *, query: dict[str, str] | None = None, body: Any = None,
                content_type: str = "application/json") -> tuple[int, Any]:
        """One request; returns ``(status, body)`` for any status: the decoded JSON (or None)
        for a 2xx answer, the raw bytes otherwise.

        Raises ApplyError (status 0, retryable) when the server cannot be reached.
        """
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        try:
            m, url, hdrs, ser_body, post = self._api.param_serialize(
                method, path, query_params=list((query or {}).items()), header_params=headers,
                body=body, auth_settings=["BearerToken"])
            resp = self._api.call_api(m, url, hdrs, ser_body, post, _request_timeout=REQUEST_TIMEOUT_S)
            data = resp.read()
        except (urllib3.exceptions.HTTPError, OSError) as exc:  # refused, timeout, TLS, DNS
            raise ApplyError(f"{method} {path}: cannot reach the API server at {self._cfg.host}: {exc}",
                             retryable=True) from None
        if 200 <= resp.status < 300:
            try:
                return resp.status, json.loads(data) if data else None
            except json.JSONDecodeError:
                return resp.status, None
        return resp.status, data

    def _check(self, what: str, status: int, data: Any) -> Any:
        if 200 <= status < 300:
            return data
        msg = _status_message(status, data if isinstance(data, bytes) else b"")
        retryable = status in (404, 409, 429) or status >= 500
        raise ApplyError(f"{what}: HTTP {status}: {msg}", status=status, retryable=retryable)

    # -- discovery ----------------------------------------------------------------------------

    def resource(self, api_version: str, kind: str) -> Resource | None:
        """The served resource of ``kind`` in ``api_version``, or None when the cluster does not
        serve it (e.g. KEDA not installed). Raises ApplyError on other failures."""
        if api_version not in self._discovered:
            path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            status, data = self.request("GET", path)
            if status == 404:
                return None
            data = self._check(f"discovery of {api_version}", status, data) or {}
            self._discovered[api_version] = {
                r["kind"]: Resource(api_version, r["kind"], r["name"], bool(r.get("namespaced")))
                for r in data.get("resources", []) if "/" not in r.get("name", "/") and r.get("kind")
            }
        return self._discovered[api_version].get(kind)

    def require(self, api_version: str, kind: str) -> Resource:
        """:meth:`resource`, raising a retryable ApplyError when the kind is not served."""
        res = self.resource(api_version, kind)
        if res is None:
            self._discovered.pop(api_version, None)  # look again next time: a CRD may be installed
            raise ApplyError(f"the cluster does not serve {kind} ({api_version}); install the component "
                             "that defines it (KEDA for ScaledObject, the Prometheus operator for PodMonitor, "
                             "Karpenter for NodePool...)", status=404, retryable=True)
        return res

    # -- verbs ---------------------------------------------------------------------------------

    def apply(self, obj: dict[str, Any], manager: str = names.FIELD_MANAGER) -> dict[str, Any]:
        """Server-side apply of one object (field manager ``tideserve`` by default, conflicts forced)."""
        res = self.require(obj["apiVersion"], obj["kind"])
        meta = obj["metadata"]
        status, data = self.request(
            "PATCH", res.path(meta.get("namespace"), meta["name"]),
            query={"fieldManager": manager, "force": "true"},
            body=obj, content_type="application/apply-patch+yaml")
        if status == 404:  # the kind went away since discovery (CRD removed): discover again next time
            self._discovered.pop(res.api_version, None)
        return self._check(f"apply {_ref(obj, res)}", status, data) or {}

    def create_if_absent(self, obj: dict[str, Any]) -> bool:
        """Create ``obj``; False when it already exists (HTTP 409), True when created."""
        res = self.require(obj["apiVersion"], obj["kind"])
        status, data = self.request("POST", res.path(obj["metadata"].get("namespace")),
                                    query={"fieldManager": names.FIELD_MANAGER}, body=obj)
        if status == 409:
            return False
        self._check(f"create {_ref(obj, res)}", status, data)
        return True

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """One object, or None when it (or its kind) does not exist. Raises ApplyError."""
        res = self.resource(api_version, kind)
        if res is None:
            return None
        status, data = self.request("GET", res.path(namespace, name))
        if status == 404:
            return None
        return self._check(f"get {kind} {name}", status, data)

    def list(self, res: Resource, namespace: str | None, label_selector: str) -> list[dict[str, Any]]:
        status, data = self.request("GET", res.path(namespace), query={"labelSelector": label_selector})
        data = self._check(f"list {res.kind}", status, data) or {}
        return list(data.get("items") or [])

    def delete(self, res: Resource, namespace: str | None, name: str) -> bool:
        """Delete one object (background propagation); False when it was already gone."""
        status, data = self.request("DELETE", res.path(namespace, name),
                                    body={"kind": "DeleteOptions", "apiVersion": "v1",
                                          "propagationPolicy": "Background"})
        if status == 404:
            return False
        self._check(f"delete {res.kind} {name}", status, data)
        return True


def _ref(obj: dict[str, Any], res: Resource | None = None) -> ObjectRef:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace") if res is None or res.namespaced else None
    return ObjectRef(obj.get("apiVersion", ""), obj.get("kind", ""), ns, meta.get("name", ""))


def _check_shape(obj: Any) -> None:
    if not isinstance(obj, dict):
        raise ApplyError(f"a rendered manifest is a {type(obj).__name__}, not a mapping")
    for key in ("apiVersion", "kind"):
        if not isinstance(obj.get(key), str) or not obj[key]:
            raise ApplyError(f"a rendered object has no {key}: {str(obj)[:200]}")
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
        raise ApplyError(f"a rendered {obj['kind']} has no metadata.name")


def decorate(obj: dict[str, Any], owner: Owner, namespaced: bool) -> dict[str, Any]:
    """A copy of ``obj`` with the endpoint's labels and, when namespaced, its namespace and
    owner reference. Pure. Raises ApplyError when ``obj`` lacks apiVersion/kind/metadata.name or
    names another namespace than the endpoint's (owner references cannot cross namespaces)."""
    _check_shape(obj)
    out = copy.deepcopy(obj)
    meta = out["metadata"]
    meta["labels"] = {**(meta.get("labels") or {}), **owner.labels()}
    if namespaced:
        ns = meta.setdefault("namespace", owner.namespace)
        if ns != owner.namespace:
            raise ApplyError(f"{obj['kind']} {meta['name']} is rendered into namespace '{ns}' but endpoint "
                             f"'{owner.name}' lives in '{owner.namespace}'; owner references cannot cross "
                             "namespaces: render into the endpoint's namespace")
        refs = [r for r in meta.get("ownerReferences") or [] if r.get("uid") != owner.uid]
        meta["ownerReferences"] = [*refs, owner.reference()]
    else:
        meta.pop("namespace", None)
    return out


def token_secret(owner: Owner, token: str | None = None) -> dict[str, Any]:
    """The worker-token Secret (``token``: 32 random bytes, URL-safe base64, unless given)."""
    token = token if token is not None else secrets.token_urlsafe(TOKEN_BYTES)
    return decorate({
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": names.token_secret_name(owner.name)},
        "data": {TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }, owner, namespaced=True)


def _kind_key(api_version: str, kind: str) -> str:
    return f"{api_version}/{kind}"


def _split_kind(key: str) -> tuple[str, str]:
    api_version, _, kind = key.rpartition("/")
    return api_version, kind


def _owned(item: dict[str, Any], owner: Owner) -> bool:
    labels = (item.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in owner.labels().items())


def _apply(cluster: Cluster, res: Resource, obj: dict[str, Any]) -> None:
    """Server-side apply of one object. An object annotated ``tideserve.io/replicas: initial``
    (a KEDA-scaled Deployment) gets its ``spec.replicas`` only when it is created: applied with
    it, then the field is applied once more by a second field manager that never applies again,
    so that it keeps the value when our later applies leave the field out (KEDA owns it then)."""
    meta = obj["metadata"]
    if (meta.get("annotations") or {}).get(names.ANNOTATION_REPLICAS) != "initial" or \
            "replicas" not in (obj.get("spec") or {}):
        cluster.apply(obj)
        return
    if cluster.get(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"]) is None:
        cluster.apply(obj)
        cluster.apply({"apiVersion": obj["apiVersion"], "kind": obj["kind"],
                       "metadata": {"name": meta["name"], **({"namespace": meta["namespace"]} if res.namespaced else {})},
                       "spec": {"replicas": obj["spec"]["replicas"]}}, manager=names.INITIAL_REPLICAS_MANAGER)
        return
    later = copy.deepcopy(obj)
    later["spec"].pop("replicas")
    cluster.apply(later)


def apply_endpoint(cluster: Cluster, owner: Owner, manifests: Iterable[dict[str, Any]],
                   previous_kinds: Iterable[str] = ()) -> ApplyResult:
    """Apply one endpoint's rendered ``manifests`` in order, create the worker token once, and
    prune this endpoint's objects the render no longer has. ``previous_kinds``: the ``kinds``
    of the previous result (``apiVersion/kind`` strings). A rendered Secret named like the
    worker token is skipped (the token is never overwritten). Every kind is resolved before
    anything is written, so an unserved kind leaves the cluster untouched. Raises ApplyError."""
    result = ApplyResult()
    desired: list[tuple[Resource, dict[str, Any]]] = []
    secret = token_secret(owner)
    for obj in manifests:
        _check_shape(obj)
        if (obj["apiVersion"], obj["kind"], obj["metadata"]["name"]) == ("v1", "Secret", secret["metadata"]["name"]):
            continue  # the token is created here once; applying a rendered one would rotate it
        res = cluster.require(obj["apiVersion"], obj["kind"])
        desired.append((res, decorate(obj, owner, res.namespaced)))

    secret_res = cluster.require("v1", "Secret")
    result.token_created = cluster.create_if_absent(secret)

    for res, obj in desired:
        _apply(cluster, res, obj)
        result.applied.append(_ref(obj, res))

    keep = {_ref(obj, res) for res, obj in desired} | {_ref(secret, secret_res)}
    # The token Secret is never pruned (it lives as long as its endpoint; the garbage collector
    # deletes it through its owner reference), so Secrets are not listed: no list right needed.
    kinds = {_kind_key(res.api_version, res.kind) for res, _ in desired}
    for key in sorted(kinds | set(previous_kinds)):
        api_version, kind = _split_kind(key)
        served = cluster.resource(api_version, kind)
        if served is None:
            continue  # not served (any more): nothing of that kind can exist
        for item in cluster.list(served, owner.namespace if served.namespaced else None, owner.selector()):
            if not _owned(item, owner):
                continue
            ref = ObjectRef(api_version, kind, owner.namespace if served.namespaced else None,
                            item["metadata"]["name"])
            if ref not in keep and cluster.delete(served, ref.namespace, ref.name):
                result.pruned.append(ref)
    result.kinds = sorted(kinds)
    return result


def delete_cluster_scoped(cluster: Cluster, owner: Owner, kinds: Iterable[str]) -> list[ObjectRef]:
    """Delete this endpoint's cluster-scoped objects of ``kinds`` (``apiVersion/kind``), which
    owner references cannot cover; namespaced kinds are skipped (the garbage collector deletes
    them through their owner reference). Returns what was deleted. Raises ApplyError."""
    deleted = []
    for key in sorted(set(kinds)):
        res = cluster.resource(*_split_kind(key))
        if res is None or res.namespaced:
            continue
        for item in cluster.list(res, None, owner.selector()):
            name = item["metadata"]["name"]
            if _owned(item, owner) and cluster.delete(res, None, name):
                deleted.append(ObjectRef(res.api_version, res.kind, None, name))
    return deleted
