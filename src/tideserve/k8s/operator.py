"""The tideserve operator: InferenceEndpoint -> render -> server-side apply -> status.

The only module of tideserve that imports kopf (DESIGN.md, rule 2); the API calls themselves go
through :mod:`tideserve.k8s.apply`. The operator is thin:

* create / update / resume of an InferenceEndpoint: validate the object with the pydantic spec,
  render it (``render`` is a parameter, :func:`tideserve.k8s.render.render_endpoint` by
  default), apply the manifests, prune what the render no longer has, and patch
  ``status.conditions``:

  - ``Ready`` True (reason ``Available``) once every object was applied, the gateway
    Deployment has a ready replica and every pool's Deployment has at least ``replicas.min``
    ready replicas (a pool with ``min: 0`` counts as ready at zero: requests are held while it
    scales up, as the gateway's own readiness says). While that is not yet so: False with reason
    ``Progressing`` and the missing parts in the message (Degraded stays False).
  - ``Degraded`` True with a reason when the endpoint cannot be brought to its desired state:
    ``InvalidSpec`` (the object fails the pydantic spec; the message lists the field paths),
    ``RendererNotImplemented``, ``RenderFailed`` (SpecError/ValueError from the renderer),
    ``ApplyFailed`` (the API server refused or could not be reached). Spec and render errors
    are final until the object changes (no retry: the same input gives the same error); a
    retryable apply error is retried after ``retry_delay_s``.

  ``status.observedGeneration`` is the generation handled, ``status.appliedKinds`` the kinds
  applied (``apiVersion/kind``, so the next apply also prunes kinds no longer rendered),
  ``status.appliedObjects`` / ``status.pruned`` what the last apply did, ``status.pools`` each
  pool's replicas / readyReplicas / desiredReplicas and ``status.address`` the gateway load
  balancer's hostname (or IP) once it has one.
* a timer (every ``observe_interval_s``) re-reads the Deployments and the gateway Service of each
  endpoint that is not Degraded and updates Ready, ``pools`` and ``address`` when they changed.
* delete: the namespaced children carry a controller owner reference to the endpoint, so the
  Kubernetes garbage collector deletes them; the handler only deletes cluster-scoped objects
  labelled for the endpoint (owner references cannot cover those), if any.
* worker pods (labels ``tideserve.io/component=worker`` and ``tideserve.io/endpoint``): once a
  pod is Ready, its ``karpenter.sh/do-not-disrupt`` annotation (set while the model loads, so
  Karpenter's consolidation does not evict a pod mid-load) is removed.

The CRD needs the ``status`` subresource and a status schema that keeps these fields
(``x-kubernetes-preserve-unknown-fields`` or the same fields declared).
"""

from __future__ import annotations

import dataclasses

import asyncio
import datetime
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import kopf

from tideserve.errors import SpecError
from tideserve.k8s import names
from tideserve.k8s.apply import ApplyError, Cluster, Owner, apply_endpoint, delete_cluster_scoped
from tideserve.k8s.render import RenderOptions, render_endpoint
from tideserve.spec.load import endpoint_from_dict
from tideserve.spec.models import InferenceEndpoint

RenderFn = Callable[[InferenceEndpoint, RenderOptions], list[dict]]
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
FINALIZER = f"{names.GROUP}/cleanup"
MAX_MESSAGE_CHARS = 2000
DEFAULT_RETRY_DELAY_S = 30.0
DEFAULT_OBSERVE_INTERVAL_S = 15.0


def condition(kind: str, ok: bool, reason: str, message: str, now: datetime.datetime,
              previous: list[dict[str, Any]] | None) -> dict[str, Any]:
    """One status condition (Kubernetes API conventions: type, status "True"/"False", reason in
    CamelCase, message, lastTransitionTime). ``lastTransitionTime`` is kept from ``previous``
    when the status did not change. Pure: ``now`` is an argument."""
    status = "True" if ok else "False"
    prev = next((c for c in previous or [] if isinstance(c, dict) and c.get("type") == kind), None)
    since = prev.get("lastTransitionTime") if prev and prev.get("status") == status else None
    return {"type": kind, "status": status, "reason": reason, "message": message[:MAX_MESSAGE_CHARS],
            "lastTransitionTime": since or now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}


def conditions(*, ready: bool, reason: str, message: str, degraded: bool, now: datetime.datetime,
               previous: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """``[Ready, Degraded]``. Degraded True repeats Ready's reason and message (what is wrong);
    Degraded False has reason ``AsExpected``. Pure."""
    return [condition("Ready", ready, reason, message, now, previous),
            condition("Degraded", True, reason, message, now, previous) if degraded
            else condition("Degraded", False, "AsExpected", "", now, previous)]


@dataclass(frozen=True)
class Observation:
    """What the cluster says about an applied endpoint: ``ready`` as Ready defines it, a
    ``message`` naming what is (not) ready, ``pools`` for ``status.pools``, the gateway's
    load-balancer ``address`` (None until it has one)."""

    ready: bool
    message: str
    pools: list[dict[str, Any]]
    address: str | None


def _ready_replicas(deployment: dict[str, Any] | None) -> int:
    return int(((deployment or {}).get("status") or {}).get("readyReplicas") or 0)


def assess(pools: list[dict[str, Any]], gateway: dict[str, Any] | None,
           deployments: dict[str, dict[str, Any] | None], service: dict[str, Any] | None) -> Observation:
    """Readiness of an endpoint from its objects (None: not found). ``pools``: the spec's pools
    (``name``, ``accelerator``, ``target``, ``replicas.min``); ``deployments``: pool name ->
    its Deployment. Pure."""
    waiting, report, ok = [], [], []
    gw_ready = _ready_replicas(gateway)
    if gateway is None:
        waiting.append("gateway Deployment missing")
    elif gw_ready < 1:
        waiting.append("gateway 0 ready")
    for pool in pools:
        dep = deployments.get(pool["name"])
        minimum = int((pool.get("replicas") or {}).get("min") or 0)
        ready = _ready_replicas(dep)
        st = (dep or {}).get("status") or {}
        report.append({"name": pool["name"], "accelerator": pool.get("accelerator", ""), "target": pool.get("target", ""),
                       "replicas": int(st.get("replicas") or 0), "readyReplicas": ready,
                       "desiredReplicas": int(((dep or {}).get("spec") or {}).get("replicas") or 0)})
        if dep is None:
            waiting.append(f"pool {pool['name']}: Deployment missing")
        elif ready < minimum:
            waiting.append(f"pool {pool['name']}: {ready} ready < minimum {minimum}")
        else:
            ok.append(f"{pool['name']} {ready} ready (min {minimum})")
    ingress = (((service or {}).get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
    address = next((i.get("hostname") or i.get("ip") for i in ingress if i.get("hostname") or i.get("ip")), None)
    if waiting:
        return Observation(False, "waiting for: " + "; ".join(waiting), report, address)
    return Observation(True, f"gateway {gw_ready} ready; pools: " + ", ".join(ok), report, address)


KopfLogger = logging.Logger | logging.LoggerAdapter[Any]
"""The logger kopf passes to handlers."""


def _namespaced(namespace: str | None) -> str:
    """The namespace of an InferenceEndpoint event (the CRD is namespaced, so kopf always gives one).

    Raises ``kopf.PermanentError`` if it is missing (a cluster-scoped copy of the CRD)."""
    if not namespace:
        raise kopf.PermanentError("InferenceEndpoint events must carry a namespace: the CRD is namespaced "
                                  "(kubectl apply the CRD that `tideserve render` writes)")
    return namespace


def observe(cluster: Cluster, name: str, namespace: str, pools: list[dict[str, Any]]) -> Observation:
    """Read the gateway Deployment and Service and each pool's Deployment, then :func:`assess`.
    Raises ApplyError."""
    gateway = cluster.get("apps/v1", "Deployment", namespace, names.gateway_name(name))
    service = cluster.get("v1", "Service", namespace, names.gateway_name(name))
    deployments = {p["name"]: cluster.get("apps/v1", "Deployment", namespace, names.worker_name(name, p["name"]))
                   for p in pools}
    return assess(pools, gateway, deployments, service)


def _report(patch: Any, status: Any, obs: Observation, now: datetime.datetime) -> None:
    """Write Ready/Degraded, pools and address into ``patch`` where they differ from ``status``."""
    previous = list(status.get("conditions") or [])
    conds = conditions(ready=obs.ready, reason="Available" if obs.ready else "Progressing", message=obs.message,
                       degraded=False, now=now, previous=previous)
    if conds != previous:
        patch.status["conditions"] = conds
    if obs.pools != list(status.get("pools") or []):
        patch.status["pools"] = obs.pools
    if obs.address and obs.address != status.get("address"):
        patch.status["address"] = obs.address


def endpoint_document(body: Any) -> dict[str, Any]:
    """The parts of a Kubernetes object the pydantic spec describes (no server-set metadata)."""
    meta = body.get("metadata") or {}
    doc: dict[str, Any] = {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"),
                           "metadata": {"name": meta.get("name")}, "spec": dict(body.get("spec") or {})}
    if meta.get("labels"):
        doc["metadata"]["labels"] = dict(meta["labels"])
    return doc


def _render(body: Any, render: RenderFn, options: RenderOptions) -> tuple[list[dict] | None, str, str]:
    """``(manifests, "", "")``, or ``(None, reason, message)`` when the spec or render fails."""
    name = (body.get("metadata") or {}).get("name")
    try:
        endpoint = endpoint_from_dict(endpoint_document(body), f"InferenceEndpoint {name}")
    except SpecError as exc:
        return None, "InvalidSpec", str(exc)
    try:
        return list(render(endpoint, options)), "", ""
    except NotImplementedError as exc:
        detail = f": {exc}" if str(exc) else ""
        return None, "RendererNotImplemented", f"the Kubernetes renderer is not implemented in this build{detail}"
    except (SpecError, ValueError) as exc:
        return None, "RenderFailed", f"cannot render {name}: {exc}"


def _pod_ready(body: Any, type: str | None = None, **_: Any) -> bool:
    if type == "DELETED":
        return False
    for cond in (body.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def make_registry(cluster: Cluster, *, image: str | None = None, options: RenderOptions | None = None,
                  render: RenderFn = render_endpoint,
                  retry_delay_s: float = DEFAULT_RETRY_DELAY_S, observe_interval_s: float = DEFAULT_OBSERVE_INTERVAL_S,
                  clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
                  ) -> kopf.OperatorRegistry:
    """A kopf registry with the operator's handlers, bound to ``cluster`` and ``render``.

    ``options``: render options for every endpoint (its namespace is set per endpoint); ``image``
    overrides their image (RenderOptions' default when both are None);
    ``retry_delay_s``: wait before retrying a retryable apply error; ``observe_interval_s``: how
    often Ready, pools and address are refreshed from the cluster.
    """
    registry = kopf.OperatorRegistry()
    resource = (names.GROUP, names.VERSION, names.PLURAL)
    base_options = options or RenderOptions()
    if image:
        base_options = dataclasses.replace(base_options, image=image)

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        c = cluster.connection()
        return kopf.ConnectionInfo(server=c.server, ca_path=c.ca_path, insecure=c.insecure, scheme=c.scheme,
                                   token=c.token, certificate_path=c.certificate_path,
                                   private_key_path=c.private_key_path)

    @kopf.on.resume(*resource, registry=registry)
    @kopf.on.create(*resource, registry=registry)
    @kopf.on.update(*resource, registry=registry)
    def reconcile(body: Any, meta: Any, status: Any, namespace: str | None, name: str, uid: str, patch: Any,
                  logger: KopfLogger, **_: Any) -> None:
        previous = list(status.get("conditions") or [])
        patch.status["observedGeneration"] = meta.get("generation")
        namespace = _namespaced(namespace)
        opts = dataclasses.replace(base_options, namespace=namespace)
        manifests, reason, message = _render(body, render, opts)
        if manifests is None:
            logger.error("%s: %s", reason, message)
            patch.status["conditions"] = conditions(ready=False, reason=reason, message=message, degraded=True,
                                                    now=clock(), previous=previous)
            return  # final for this generation: the same spec gives the same error
        owner = Owner(name=name, namespace=namespace, uid=uid)
        try:
            result = apply_endpoint(cluster, owner, manifests, previous_kinds=status.get("appliedKinds") or [])
            obs = observe(cluster, name, namespace, list(body.get("spec", {}).get("pools") or []))
        except ApplyError as exc:
            logger.error("ApplyFailed: %s", exc)
            patch.status["conditions"] = conditions(ready=False, reason="ApplyFailed", message=str(exc), degraded=True,
                                                    now=clock(), previous=previous)
            if exc.retryable:
                raise kopf.TemporaryError(str(exc), delay=retry_delay_s) from exc
            return
        patch.status["appliedKinds"] = result.kinds
        patch.status["appliedObjects"] = len(result.applied)
        patch.status["pruned"] = [str(r) for r in result.pruned]
        logger.info("%d objects applied, %d pruned%s; %s", len(result.applied), len(result.pruned),
                    f" ({', '.join(map(str, result.pruned))})" if result.pruned else "", obs.message)
        _report(patch, status, obs, clock())

    @kopf.timer(*resource, interval=observe_interval_s, registry=registry)
    def watch_readiness(spec: Any, meta: Any, status: Any, namespace: str | None, name: str, patch: Any,
                        logger: KopfLogger, **_: Any) -> None:
        degraded = next((c for c in status.get("conditions") or [] if c.get("type") == "Degraded"), None)
        if degraded is None or degraded.get("status") != "False" or \
                status.get("observedGeneration") != meta.get("generation"):
            return  # not applied yet, Degraded, or a new spec in progress: the create/update handler reports
        try:
            obs = observe(cluster, name, _namespaced(namespace), list(spec.get("pools") or []))
        except ApplyError as exc:
            logger.warning("cannot read the state of %s: %s", name, exc)
            return
        _report(patch, status, obs, clock())

    @kopf.on.delete(*resource, registry=registry)
    def cleanup(status: Any, namespace: str | None, name: str, uid: str, logger: KopfLogger, **_: Any) -> None:
        owner = Owner(name=name, namespace=_namespaced(namespace), uid=uid)
        try:
            deleted = delete_cluster_scoped(cluster, owner, status.get("appliedKinds") or [])
        except ApplyError as exc:
            if exc.retryable:
                raise kopf.TemporaryError(str(exc), delay=retry_delay_s) from exc
            logger.error("cannot delete the cluster-scoped objects of %s (delete them by label %s): %s",
                         name, owner.selector(), exc)
            return
        logger.info("namespaced objects go with the endpoint through their owner reference (garbage "
                    "collector); cluster-scoped objects deleted: %s", ", ".join(map(str, deleted)) or "none")

    @kopf.on.event("", "v1", "pods", registry=registry,
                   labels={names.LABEL_COMPONENT: "worker", names.LABEL_ENDPOINT: kopf.PRESENT},
                   annotations={DO_NOT_DISRUPT: kopf.PRESENT}, when=_pod_ready)
    def release_ready_worker(patch: Any, name: str, logger: KopfLogger, **_: Any) -> None:
        patch.metadata.annotations[DO_NOT_DISRUPT] = None
        logger.info("worker pod %s is Ready: removed %s, Karpenter may consolidate its node again",
                    name, DO_NOT_DISRUPT)

    return registry


class KopfRecordFilter(logging.Filter):
    """Turn kopf's record attributes (``settings``, ``k8s_skip``, ``k8s_ref``) into one
    ``object`` field (``namespace/name``), so tideserve's formatters, which print every extra
    attribute, print the object a line is about instead of kopf's whole settings."""

    def filter(self, record: logging.LogRecord) -> bool:
        ref = record.__dict__.pop("k8s_ref", None)
        record.__dict__.pop("settings", None)
        record.__dict__.pop("k8s_skip", None)
        if isinstance(ref, dict) and ref.get("name"):
            record.object = "/".join(x for x in (ref.get("namespace"), ref.get("name")) if x)
        return True


def install_log_filter(logger: logging.Logger | None = None) -> None:
    """Add :class:`KopfRecordFilter` to every handler of ``logger`` (the root logger by default)."""
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, KopfRecordFilter) for f in handler.filters):
            handler.addFilter(KopfRecordFilter())


def make_settings(*, consistency_timeout_s: float = 5.0) -> kopf.OperatorSettings:
    """kopf settings: tideserve's own finalizer and annotation prefix (progress and diff base
    kept in annotations, so ``status`` holds only what the operator reports)."""
    s = kopf.OperatorSettings()
    s.persistence.finalizer = FINALIZER
    s.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=names.GROUP)
    s.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=names.GROUP)
    s.persistence.consistency_timeout = consistency_timeout_s
    # The readiness timer runs blocking API reads in a thread; give a run in flight this long to
    # finish when the operator stops or an endpoint goes, instead of orphaning it.
    s.background.instant_exit_timeout = 0.5
    s.posting.reporting_component = "tideserve-operator"
    return s


async def run_operator(cluster: Cluster, *, namespaces: list[str] | None = None, image: str | None = None,
                       options: RenderOptions | None = None,
                       render: RenderFn = render_endpoint, liveness_endpoint: str | None = None,
                       stop_flag: asyncio.Event | threading.Event | None = None,
                       ready_flag: asyncio.Event | threading.Event | None = None,
                       retry_delay_s: float = DEFAULT_RETRY_DELAY_S,
                       observe_interval_s: float = DEFAULT_OBSERVE_INTERVAL_S,
                       settings: kopf.OperatorSettings | None = None) -> None:
    """Run the operator in this event loop until ``stop_flag`` is set (or the task cancelled).

    ``namespaces``: watch only these; None or empty: every namespace (cluster-wide). Standalone
    (no peering objects needed). ``liveness_endpoint``: e.g. ``http://0.0.0.0:8081/healthz``.
    """
    await kopf.operator(
        registry=make_registry(cluster, image=image, options=options, render=render, retry_delay_s=retry_delay_s,
                               observe_interval_s=observe_interval_s),
        settings=settings or make_settings(), standalone=True,
        clusterwide=not namespaces, namespaces=list(namespaces or []),
        liveness_endpoint=liveness_endpoint, stop_flag=stop_flag, ready_flag=ready_flag,
    )
