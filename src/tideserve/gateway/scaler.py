"""The gateway's KEDA external scaler: gRPC (``grpc.aio``) in the gateway's event loop.

Kubernetes mode only. One KEDA ScaledObject per pool names this server as its
``scalerAddress`` (``<endpoint>-scaler.<namespace>.svc:9090``, the in-cluster Service in front
of the gateway's gRPC port) with trigger metadata ``{endpoint: <endpoint name>, pool: <pool name>}``.
The autoscaler (the same policy and control loop as embedded mode) decides each pool's desired
replicas; this module only publishes them:

- ``IsActive`` / ``StreamIsActive``: true while the policy wants the pool above zero, or while
  requests are held that the policy would place on this pool first (activation from zero must
  not wait for the next decision). KEDA uses it for the 0 <-> 1 step.
- ``GetMetricSpec`` / ``GetMetrics``: one metric per pool, an HPA ``AverageValue`` external
  metric whose numbers make the HPA arrive at the policy's desired replicas (see
  ``metric_numbers``).
- ``StreamMetricSpec``: the spec once, then the stream stays open (the target never changes
  while the gateway runs).

This module is the gateway's only importer of ``grpc`` (checked by import-linter).

How the numbers map onto KEDA and the HPA
-----------------------------------------
KEDA turns the floats it receives into Kubernetes quantities in milli-units,
``int64(value * 1000)``, for the target (``targetSizeFloat``) and for each value
(``metricValueFloat``); the HPA then computes, for an AverageValue external metric with
usage U, per-pod target T and C current replicas (kubernetes.io, Horizontal Pod Autoscaling)::

    ratio = U / (T * C)
    desired = C                 if |ratio - 1| <= tolerance   (default 0.1)
    desired = ceil(U / T)       otherwise

We report T = the endpoint's ``autoscaling.target`` (requests per replica, rounded to a
milli-unit) and U = D * T, where D is the policy's desired replicas for the pool. So the HPA
shows "load per replica / target" as usual, and ``ceil(U / T) = D`` exactly: both are sent so
that KEDA's truncating conversion yields exactly the integers T_m and D * T_m milli-units (a
float whose product with 1000 would land just below the integer is nudged by half a
milli-unit), and integer division leaves no rounding.

The tolerance: U / (T * C) = D / C. If C = D the HPA keeps D (ratio 1). If C != D then
|D / C - 1| = |D - C| / C >= 1 / C, which exceeds 0.1 whenever C <= 9: every decision up to
nine replicas survives the tolerance, and so does any change larger than 10 % beyond that.
What no reported number can avoid: with C >= 10 and |D - C| <= 0.1 C (e.g. 10 -> 11), every U
with ceil(U / T) = D gives a ratio inside [0.9, 1.1], so the default tolerance keeps C there
(at most 10 % off D) until the difference grows. The HPA's own tolerance is configurable per
ScaledObject (``advanced.horizontalPodAutoscalerConfig.behavior.scaleUp/scaleDown.tolerance``,
a beta field behind the HPAConfigurableTolerance feature gate, per its description in KEDA's
ScaledObject CRD); set to 0 the HPA lands on D at every size. ``hpa_desired`` models this
arithmetic for the tests.

D = 0: U = 0; the HPA cannot go below ``minReplicas`` (>= 1), and KEDA takes the pool to zero
once ``IsActive`` has been false for its cooldownPeriod.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from dataclasses import dataclass
from typing import Protocol
from collections.abc import AsyncIterator, Sequence

import grpc

from tideserve.gateway import externalscaler_pb2 as pb
from tideserve.gateway import externalscaler_pb2_grpc as pb_grpc

log = logging.getLogger("tideserve.scaler")

MILLI = 1000
#: Metadata keys a ScaledObject's trigger carries.
METADATA_ENDPOINT = "endpoint"
METADATA_POOL = "pool"


# --- the arithmetic (pure) ---------------------------------------------------------------------
def target_milli(target: float) -> int:
    """The per-replica metric target in milli-units (>= 1): ``autoscaling.target`` rounded.

    Raises ValueError for a target that is not a finite number > 0.
    """
    if not math.isfinite(target) or target <= 0:
        raise ValueError(f"metric target must be a finite number > 0, got {target!r}")
    return max(1, round(target * MILLI))


def wire_float(milli: int) -> float:
    """A float that KEDA's ``int64(value * 1000)`` turns back into exactly ``milli``."""
    x = milli / MILLI
    if int(x * MILLI) != milli:
        x = (milli + 0.5) / MILLI  # truncation would give milli - 1: aim at the middle
    return x


@dataclass(frozen=True)
class MetricNumbers:
    """What one pool reports: target and value in milli-units, and as sent on the wire."""

    target_milli: int
    value_milli: int

    @property
    def target_float(self) -> float:
        return wire_float(self.target_milli)

    @property
    def value_float(self) -> float:
        return wire_float(self.value_milli)


def metric_numbers(desired: int, target: float) -> MetricNumbers:
    """The HPA AverageValue target and value for ``desired`` replicas: T = target, U = desired * T
    (milli-units), so that ``ceil(U / T) == desired`` (module docstring). Raises ValueError
    for desired < 0 or a bad target."""
    if desired < 0:
        raise ValueError(f"desired replicas must be >= 0, got {desired}")
    t = target_milli(target)
    return MetricNumbers(t, desired * t)


def keda_milli(value: float) -> int:
    """KEDA's conversion of a reported float to a milli-quantity: ``int64(value * 1000)``."""
    return int(value * MILLI)


def hpa_desired(value_milli: int, target_milli_: int, current: int, tolerance: float = 0.1) -> int:
    """The HPA's replica count for an AverageValue external metric (before min/max clamping):
    ``current`` if |U / (T * current) - 1| <= tolerance, else ceil(U / T) (kubernetes.io,
    Horizontal Pod Autoscaling; tolerance default 0.1). ``current`` >= 1."""
    if current < 1:
        raise ValueError("the HPA runs only at >= 1 replica (KEDA does 0 <-> 1)")
    ratio = value_milli / (target_milli_ * current)
    if abs(1.0 - ratio) <= tolerance:
        return current
    return -(-value_milli // target_milli_)  # ceil, in integers


def metric_name(endpoint: str, pool: str) -> str:
    """The pool's metric name (KEDA prefixes it with ``s<trigger index>-`` in the HPA)."""
    return f"tideserve-{endpoint}-{pool}-load"


# --- what the scaler publishes ---------------------------------------------------------------
class ScalingView(Protocol):
    """The autoscaler's latest decision and the gateway's held requests, per pool."""

    endpoint: str

    def pools(self) -> Sequence[str]: ...

    def desired(self, pool: str) -> int:
        """The policy's desired replicas for ``pool`` in its latest decision (0 before any)."""
        ...

    def held_for(self, pool: str) -> bool:
        """Requests are held now that the policy would place on ``pool`` first."""
        ...


class _Invalid(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ExternalScaler(pb_grpc.ExternalScalerServicer):
    """The servicer. ``notify()`` wakes the streams (a decision was applied, a request was held).

    Errors to KEDA: INVALID_ARGUMENT when the trigger metadata has no ``pool`` or asks for a
    metric name this pool does not report; NOT_FOUND for another endpoint or an unknown pool;
    each message names what is served.
    """

    def __init__(self, view: ScalingView, target: float, recheck_s: float = 5.0) -> None:
        self.view = view
        self.target = target
        target_milli(target)  # fail at construction on a bad target
        self.recheck_s = recheck_s
        self._changed = asyncio.Event()

    def notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # --- helpers ---
    def pool_of(self, ref: pb.ScaledObjectRef) -> str:
        """The pool a ScaledObjectRef names. Raises _Invalid."""
        md = dict(ref.scalerMetadata)
        pools = list(self.view.pools())
        ep = md.get(METADATA_ENDPOINT)
        if ep is not None and ep != self.view.endpoint:
            raise _Invalid(grpc.StatusCode.NOT_FOUND,
                           f"this gateway serves endpoint '{self.view.endpoint}', not '{ep}': point the "
                           f"ScaledObject's scalerAddress at {ep}-scaler.<namespace>.svc:9090, or fix scalerMetadata.endpoint")
        pool = md.get(METADATA_POOL)
        if not pool:
            raise _Invalid(grpc.StatusCode.INVALID_ARGUMENT,
                           f"scalerMetadata has no '{METADATA_POOL}': set it to one of the pools of endpoint "
                           f"'{self.view.endpoint}': {', '.join(pools)}")
        if pool not in pools:
            raise _Invalid(grpc.StatusCode.NOT_FOUND,
                           f"unknown pool '{pool}' in scalerMetadata: endpoint '{self.view.endpoint}' has pools "
                           f"{', '.join(pools)}")
        return pool

    def active(self, pool: str) -> bool:
        return self.view.desired(pool) > 0 or self.view.held_for(pool)

    def spec(self, pool: str) -> pb.GetMetricSpecResponse:
        n = metric_numbers(0, self.target)
        return pb.GetMetricSpecResponse(metricSpecs=[pb.MetricSpec(
            metricName=metric_name(self.view.endpoint, pool),
            targetSizeFloat=n.target_float,
            # The integer field (older KEDA) in milli-units: the same ratio U / T, exact.
            targetSize=n.target_milli,
        )])

    @staticmethod
    async def _abort(context: grpc.aio.ServicerContext, exc: _Invalid) -> None:
        log.warning("external scaler request refused: %s", exc.message)
        await context.abort(exc.code, exc.message)

    # --- the RPCs ---
    async def IsActive(self, request, context):
        try:
            pool = self.pool_of(request)
        except _Invalid as exc:
            await self._abort(context, exc)
        return pb.IsActiveResponse(result=self.active(pool))

    async def StreamIsActive(self, request, context) -> AsyncIterator[pb.IsActiveResponse]:
        try:
            pool = self.pool_of(request)
        except _Invalid as exc:
            await self._abort(context, exc)
        last: bool | None = None
        while True:
            changed = self._changed
            now = self.active(pool)
            if now != last:
                yield pb.IsActiveResponse(result=now)
                last = now
            # Also re-check now and then, in case a change came without a notify.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), self.recheck_s)

    async def GetMetricSpec(self, request, context):
        try:
            pool = self.pool_of(request)
        except _Invalid as exc:
            await self._abort(context, exc)
        return self.spec(pool)

    async def StreamMetricSpec(self, request, context) -> AsyncIterator[pb.GetMetricSpecResponse]:
        try:
            pool = self.pool_of(request)
        except _Invalid as exc:
            await self._abort(context, exc)
        yield self.spec(pool)
        await asyncio.Event().wait()  # the target is fixed: nothing more to push until the stream ends

    async def GetMetrics(self, request, context):
        try:
            pool = self.pool_of(request.scaledObjectRef)
            name = metric_name(self.view.endpoint, pool)
            asked = request.metricName
            # KEDA strips its "s<index>-" prefix before asking; accept it either way.
            if asked and asked != name and not asked.endswith("-" + name):
                raise _Invalid(grpc.StatusCode.INVALID_ARGUMENT,
                               f"unknown metric '{asked}' for pool '{pool}': this pool reports '{name}'")
        except _Invalid as exc:
            await self._abort(context, exc)
        n = metric_numbers(self.view.desired(pool), self.target)
        return pb.GetMetricsResponse(metricValues=[pb.MetricValue(
            metricName=name, metricValueFloat=n.value_float, metricValue=n.value_milli)])


class ScalerServer:
    """The gRPC server around ``ExternalScaler``; start and stop it inside the running loop."""

    def __init__(self, scaler: ExternalScaler) -> None:
        self.scaler = scaler
        self._server: grpc.aio.Server | None = None
        self.port: int | None = None

    def notify(self) -> None:
        self.scaler.notify()

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: any free port); return the bound port. Raises OSError
        when the address cannot be bound."""
        server = grpc.aio.server()
        pb_grpc.add_ExternalScalerServicer_to_server(self.scaler, server)
        addr = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            bound = server.add_insecure_port(addr)
        except RuntimeError as exc:  # grpc reports a failed bind this way
            raise OSError(f"cannot listen on {addr}: {exc}") from None
        if bound == 0:
            raise OSError(f"cannot listen on {addr}")
        await server.start()
        self._server, self.port = server, bound
        return bound

    async def stop(self, grace_s: float = 1.0) -> None:
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None
