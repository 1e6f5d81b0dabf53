"""The autoscaling policy, a pure function of a snapshot, the spec, its state and ``now``.

``decide(snapshot, spec, state, now) -> (decision, state)``; no clock, no I/O, so the control
loop, the simulator and the tests drive the same code.

Rules (defaults and sources in ../shared/FACTS.md):

1. Load = pending (held at the gateway) + in-flight requests. Desired total replicas =
   ceil(load / target), the Kubernetes HPA formula ``ceil(current * metric / target)`` with
   metric = load per replica; no change while |load / (current * target) - 1| <= tolerance
   (HPA default 0.1).
2. Scale up at once. Scale down only to the highest recommendation seen over
   ``scale_down_stabilization_s`` (the HPA's stabilization window).
3. Keep at least one replica until ``scale_to_zero_after_s`` has passed with no request
   arrival at all (every arrival resets the timer, however short the request); then go to
   the pools' minimum at once (KEDA's cooldown governs 1 -> 0, the HPA window N -> M >= 1).
4. Activation: at zero replicas, any held request gives a desired total >= 1 at once.
5. Placement: each pool gets its ``min``; the rest goes to pools in order of cost per unit of
   measured service rate (cheapest first), within each pool's ``max`` and the machine's
   replica slots. A smaller total therefore removes replicas from the most expensive pool
   first. Within a pool, the replicas drained are those with the least work (starting
   replicas first, then the fewest outstanding requests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

from tideserve.spec.models import Autoscaling


@dataclass(frozen=True)
class ReplicaSnapshot:
    id: str
    state: str  # starting | ready (draining replicas are not listed)
    outstanding: int = 0


@dataclass(frozen=True)
class PoolSnapshot:
    """One pool at decision time. ``service_rate`` is the measured requests per second one of
    its replicas serves (None until measured); unschedulable pools get no replicas."""

    name: str
    min_replicas: int
    max_replicas: int
    cost_usd_per_h: float = 0.0
    service_rate: float | None = None
    schedulable: bool = True
    replicas: tuple[ReplicaSnapshot, ...] = ()


@dataclass(frozen=True)
class Snapshot:
    """What the gateway and the runtime know at ``now``. ``last_arrival`` is on the same clock
    as ``now`` (None: no request ever). ``slots`` caps the total (embedded: replica_slots)."""

    pending: int
    in_flight: int
    last_arrival: float | None
    pools: tuple[PoolSnapshot, ...]
    slots: int | None = None


@dataclass(frozen=True)
class ScalingState:
    """Recommendations ``(time, total)`` still inside the stabilization window."""

    recommendations: tuple[tuple[float, int], ...] = ()


@dataclass(frozen=True)
class Decision:
    """Each pool's desired replicas, the replicas to drain, and why."""

    desired: Mapping[str, int]
    drain: tuple[str, ...]
    total: int
    reason: str
    inputs: Mapping[str, float | int | None] = field(default_factory=dict)


def _cost_per_rate(p: PoolSnapshot, default_rate: float) -> float:
    rate = p.service_rate if p.service_rate and p.service_rate > 0 else default_rate
    return p.cost_usd_per_h / rate


def place(total: int, pools: tuple[PoolSnapshot, ...], slots: int | None = None) -> dict[str, int]:
    """Spread ``total`` replicas over ``pools``: mins first, then cheapest per unit of service
    rate first, within each pool's max and ``slots`` in all. Unschedulable pools get 0."""
    usable = [p for p in pools if p.schedulable]
    known = [p.service_rate for p in usable if p.service_rate]
    default_rate = sum(known) / len(known) if known else 1.0
    order = sorted(
        range(len(usable)),
        key=lambda i: (_cost_per_rate(usable[i], default_rate), -(usable[i].service_rate or default_rate), i),
    )
    desired = {p.name: 0 for p in pools}
    budget = slots if slots is not None else math.inf
    for i in order:  # mins first, cheapest pools' mins first if slots are short
        n = int(min(usable[i].min_replicas, budget))
        desired[usable[i].name] = n
        budget -= n
    remaining = min(total - sum(desired.values()), budget)
    for i in order:
        if remaining <= 0:
            break
        p = usable[i]
        add = int(min(remaining, p.max_replicas - desired[p.name]))
        desired[p.name] += add
        remaining -= add
    return desired


def _to_drain(pool: PoolSnapshot, keep: int) -> list[str]:
    extra = len(pool.replicas) - keep
    if extra <= 0:
        return []
    # Least work first: starting replicas (no work yet, still costing), then fewest outstanding;
    # among equals the newest (listed last) goes first.
    ranked = sorted(
        enumerate(pool.replicas), key=lambda ir: (ir[1].state != "starting", ir[1].outstanding, -ir[0])
    )
    return [r.id for _, r in ranked[:extra]]


def decide(
    snapshot: Snapshot, spec: Autoscaling, state: ScalingState, now: float
) -> tuple[Decision, ScalingState]:
    """One autoscaling decision. Pure: the same inputs give the same outputs."""
    pools = snapshot.pools
    usable = [p for p in pools if p.schedulable]
    current = sum(len(p.replicas) for p in usable)
    load = snapshot.pending + snapshot.in_flight
    ceiling = sum(p.max_replicas for p in usable)
    if snapshot.slots is not None:
        ceiling = min(ceiling, snapshot.slots)
    floor = min(sum(p.min_replicas for p in usable), ceiling)  # mins beyond the slots cannot all run
    since = None if snapshot.last_arrival is None else now - snapshot.last_arrival
    idle = since is None or since >= spec.scale_to_zero_after_s

    if load == 0:
        raw, why = 0, "no load"
    elif current == 0:
        raw, why = math.ceil(load / spec.target), f"activation: {load} request(s) held at zero replicas"
    else:
        ratio = load / (current * spec.target)
        if abs(ratio - 1) <= spec.tolerance:
            raw, why = current, f"load/target ratio {ratio:.2f} within tolerance {spec.tolerance:g}"
        else:
            raw, why = math.ceil(load / spec.target), f"ceil(load {load} / target {spec.target:g})"
    if not idle and raw < 1:
        raw, why = 1, f"last arrival {since:.1f}s ago < scale_to_zero_after_s {spec.scale_to_zero_after_s:g}"

    window = [(t, v) for t, v in state.recommendations if now - t < spec.scale_down_stabilization_s]
    window.append((now, raw))
    if idle and load == 0:
        total = 0
        why = "no request arrival" + (f" for {since:.1f}s" if since is not None else " yet") + \
              f" (scale_to_zero_after_s {spec.scale_to_zero_after_s:g}): scale to the pools' minimum"
    elif raw < current:
        total = min(current, max(v for _, v in window))
        if total > raw:
            why += f"; held at {total} by the {spec.scale_down_stabilization_s:g}s stabilization window"
    else:
        total = raw
    clamped = max(floor, min(ceiling, total))
    if clamped != total:
        why += f"; clamped to [{floor}, {ceiling}]"
    desired = place(clamped, pools, snapshot.slots)
    drain: list[str] = []
    for p in pools:
        drain += _to_drain(p, desired[p.name] if p.schedulable else 0)
    decision = Decision(
        desired=desired, drain=tuple(drain), total=sum(desired.values()), reason=why,
        inputs={"pending": snapshot.pending, "in_flight": snapshot.in_flight, "current": current,
                "target": spec.target, "since_last_arrival_s": None if since is None else round(since, 3),
                "recommendation": raw},
    )
    return decision, ScalingState(tuple(window))
