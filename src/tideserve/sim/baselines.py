"""Autoscalers tideserve is compared against, replayed in the same simulator on the same traces.

Each is a pure ``decide(snapshot, spec, state, now) -> (Decision, state)`` like tideserve's own
(``tideserve.autoscaler.policy``), with its own state, decision interval and wake-up rule
(``Scaler``). They see the same ``Snapshot`` (pending + in-flight requests, replicas, pools) and
their decisions are applied by the same code. Published behaviour reproduced (sources in
docs/autoscaling.md):

``keda-hpa``: KEDA feeding the Kubernetes HPA. Metric: requests (held + in flight), read by
KEDA every ``pollingInterval`` = 30 s; the HPA runs every 15 s (``--horizontal-pod-autoscaler-
sync-period``) with desired = ceil(current x metric / target) per replica (AverageValue target:
ceil(total / target)), no change while |ratio - 1| <= 0.1 (tolerance), scale-up limited to the
larger of +100% and +4 pods per 15 s (the HPA's default scaleUp policies), scale-down to the
highest recommendation of the last 300 s (default scaleDown stabilization). KEDA activation:
0 -> 1 when the polled metric is > activationThreshold 0; 1 -> 0 once the metric has been 0 for
``cooldownPeriod`` = 300 s. KEDA does not wake on a held request: activation waits for a poll.
The target per replica is the endpoint's ``autoscaling.target``.

``knative``: the Knative Pod Autoscaler (KPA). Every ``tick-interval`` 2 s it samples
concurrency (requests held by the activator + in flight); desired = ceil(average / target) over
the stable window (60 s) and over the panic window (6 s = 10% of it). Panic mode starts when the
panic desired is >= 200% of the ready replicas (``panic-threshold-percentage``) and lasts until
a stable window has passed without that condition; in panic the count never goes down. Scale
down is limited to halving per tick (``max-scale-down-rate`` 2), scale up to x1000. To zero:
once the stable average is 0, after ``scale-to-zero-grace-period`` 30 s. The activator holds
requests at zero replicas and pokes the autoscaler at once (wakes on a hold). Target: the
endpoint's ``autoscaling.target`` (Knative's default is 100 x 70% = 70 concurrent requests;
a batched Whisper replica is sized by the same ``target`` the other request-count runs use).

``oracle``: knows every arrival (time and audio seconds) in advance and each pool's cold start
(the snapshot's). On a 1 s grid it computes the replicas r(t) whose capacity serves the audio
arriving in [t - B, t] within B = the SLO budget (``slo_p95_s`` minus the lone-request latency)
on the cheapest pool per unit of capacity; at ``now`` it asks for max r(t) over t in
[now, now + cold start] (so each replica is started one cold start before it is needed and kept
through any gap shorter than a cold start: the break-even), and at least what the backlog
outstanding now needs. It is a clairvoyant heuristic, not a proven optimum: the lower bound on
cost at the SLO that a reactive policy can be compared with.

``tideserve``: ``policy.decide`` with the endpoint's spec (``decide`` None: the simulator calls
its live policy function so that tests can spy on it).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any
from collections.abc import Callable, Sequence

from tideserve.autoscaler.policy import Decision, ScalingState, Snapshot, place, settle
from tideserve.sim.coldstart import ColdStartCatalog
from tideserve.sim.trace import TraceRequest
from tideserve.spec.models import Autoscaling, EndpointSpec

Decide = Callable[[Snapshot, Autoscaling, Any, float], tuple[Decision, Any]]

NAMES = ("tideserve", "keda-hpa", "knative", "oracle")

# Kubernetes HPA and KEDA defaults (docs/autoscaling.md; sources: docs/facts.md).
HPA_SYNC_S = 15.0
HPA_TOLERANCE = 0.1
HPA_SCALE_DOWN_STABILIZATION_S = 300.0
HPA_SCALE_UP_PERCENT = 100
HPA_SCALE_UP_PODS = 4
KEDA_POLLING_S = 30.0
KEDA_COOLDOWN_S = 300.0
KEDA_ACTIVATION = 0.0
# Knative KPA defaults (docs/autoscaling.md).
KPA_TICK_S = 2.0
KPA_STABLE_WINDOW_S = 60.0
KPA_PANIC_WINDOW_S = 6.0
KPA_PANIC_THRESHOLD = 2.0
KPA_SCALE_TO_ZERO_GRACE_S = 30.0
KPA_MAX_SCALE_DOWN_RATE = 2.0
KPA_MAX_SCALE_UP_RATE = 1000.0


@dataclass(frozen=True)
class Scaler:
    """An autoscaler as the simulator runs it: ``decide`` (None: the live ``policy.decide``),
    its initial state, seconds between decisions (None: ``autoscaling.interval_s``) and whether
    a held request or a lost replica triggers a decision at once."""

    name: str
    decide: Decide | None
    initial_state: Any
    interval_s: float | None
    wake_on_hold: bool


def _current(s: Snapshot) -> int:
    return sum(len(p.replicas) for p in s.pools if p.schedulable)


def _ready(s: Snapshot) -> int:
    return sum(1 for p in s.pools if p.schedulable for r in p.replicas if r.state == "ready")


# -- KEDA + HPA ------------------------------------------------------------------------------


@dataclass(frozen=True)
class KedaHpaState:
    metric: float = 0.0  # the last value KEDA polled
    polled_at: float | None = None
    last_active: float | None = None
    recommendations: tuple[tuple[float, int], ...] = ()


def keda_hpa_decide(s: Snapshot, spec: Autoscaling, st: KedaHpaState, now: float) -> tuple[Decision, KedaHpaState]:
    """One HPA sync (every 15 s) on the metric KEDA polled last (module docstring)."""
    metric, polled_at = st.metric, st.polled_at
    if polled_at is None or now - polled_at >= KEDA_POLLING_S - 1e-9:
        metric, polled_at = float(s.pending + s.in_flight), now
    active = metric > KEDA_ACTIVATION
    last_active = now if active else st.last_active
    current = _current(s)
    window = [(t, v) for t, v in st.recommendations if now - t < HPA_SCALE_DOWN_STABILIZATION_S]
    if not active:
        if current > 0 and last_active is not None and now - last_active < KEDA_COOLDOWN_S:
            # The HPA (minReplicas 1 while KEDA keeps the target active) recommends 1; its
            # scale-down window may hold more.
            window.append((now, 1))
            total = min(current, max(v for _, v in window))
            why = (f"KEDA: metric 0, {now - last_active:.0f}s since active < cooldownPeriod {KEDA_COOLDOWN_S:g}s; "
                   f"HPA holds {total}")
        else:
            total, why = 0, f"KEDA: metric 0 for >= cooldownPeriod {KEDA_COOLDOWN_S:g}s: scale to zero"
            window = []
        return settle(s, total, why, inputs={"metric": metric}), KedaHpaState(metric, polled_at, last_active, tuple(window))
    if current == 0:
        raw = max(1, math.ceil(metric / spec.target))
        total, why = 1, f"KEDA activation: metric {metric:g} > {KEDA_ACTIVATION:g}: 0 -> 1"
        window.append((now, raw))
        return settle(s, total, why, inputs={"metric": metric}), KedaHpaState(metric, polled_at, last_active, tuple(window))
    ratio = metric / (current * spec.target)
    if abs(ratio - 1) <= HPA_TOLERANCE:
        raw, why = current, f"HPA: ratio {ratio:.2f} within tolerance {HPA_TOLERANCE:g}"
    else:
        raw, why = math.ceil(current * ratio), f"HPA: ceil({current} x {metric:g} / ({current} x {spec.target:g}))"
    raw = max(1, raw)
    window.append((now, raw))
    if raw > current:
        limit = max(current * (1 + HPA_SCALE_UP_PERCENT / 100), current + HPA_SCALE_UP_PODS)
        total = int(min(raw, limit))
        if total < raw:
            why += f"; scale-up limited to {total} (max of +100% and +4 pods per 15 s)"
    else:
        total = max(v for _, v in window)
        total = min(current, total)
        if total > raw:
            why += f"; held at {total} by the {HPA_SCALE_DOWN_STABILIZATION_S:g}s stabilization window"
    return (settle(s, total, why, inputs={"metric": metric, "recommendation": raw}),
            KedaHpaState(metric, polled_at, last_active, tuple(window)))


# -- Knative KPA -----------------------------------------------------------------------------


@dataclass(frozen=True)
class KpaState:
    samples: tuple[tuple[float, float], ...] = ()  # (time, concurrency) within the stable window
    panic_since: float | None = None
    last_panic_condition: float | None = None
    zero_since: float | None = None  # stable average first 0


def knative_decide(s: Snapshot, spec: Autoscaling, st: KpaState, now: float) -> tuple[Decision, KpaState]:
    """One KPA tick (module docstring)."""
    conc = float(s.pending + s.in_flight)
    samples = (*tuple((t, c) for t, c in st.samples if now - t < KPA_STABLE_WINDOW_S), (now, conc))
    stable = sum(c for _, c in samples) / len(samples)
    panic_s = [c for t, c in samples if now - t < KPA_PANIC_WINDOW_S]
    panic = sum(panic_s) / len(panic_s)
    current, ready = _current(s), _ready(s)
    want_stable = math.ceil(stable / spec.target)
    want_panic = math.ceil(panic / spec.target)
    if current == 0:
        if s.pending > 0:
            total = max(1, want_panic)
            return (settle(s, total, f"KPA: activator holds {s.pending} request(s) at zero: scale from zero to {total}"),
                    KpaState(samples, None, None, None))
        return settle(s, 0, "KPA: no replica, no request"), KpaState(samples, None, None, None)
    condition = want_panic >= KPA_PANIC_THRESHOLD * max(1, ready)
    last_cond = now if condition else st.last_panic_condition
    panic_since = st.panic_since
    if condition and panic_since is None:
        panic_since = now
    elif panic_since is not None and last_cond is not None and now - last_cond >= KPA_STABLE_WINDOW_S:
        panic_since = None
    if panic_since is not None:
        total = max(current, want_panic)
        why = f"KPA panic: panic-window concurrency {panic:.1f} / target {spec.target:g} -> {want_panic} (never down)"
    else:
        total = want_stable
        why = f"KPA stable: stable-window concurrency {stable:.2f} / target {spec.target:g} -> {want_stable}"
    total = min(total, math.ceil(current * KPA_MAX_SCALE_UP_RATE))
    total = max(total, math.floor(current / KPA_MAX_SCALE_DOWN_RATE)) if total < current else total
    zero_since = st.zero_since
    if stable == 0 and panic_since is None:
        zero_since = now if zero_since is None else zero_since
        if now - zero_since >= KPA_SCALE_TO_ZERO_GRACE_S:
            total, why = 0, f"KPA: stable concurrency 0 for >= scale-to-zero-grace-period {KPA_SCALE_TO_ZERO_GRACE_S:g}s"
        else:
            total = max(total, 1)
            why += f"; grace period {KPA_SCALE_TO_ZERO_GRACE_S:g}s before zero"
    else:
        zero_since = None
        total = max(total, 1)
    return (settle(s, total, why, inputs={"stable": stable, "panic": panic}),
            KpaState(samples, panic_since, last_cond, zero_since))


# -- oracle ----------------------------------------------------------------------------------


@dataclass
class OracleState:
    """The oracle's plan, built at its first decision (it needs the pools' capacities)."""

    plan: list[int] | None = None
    notes: dict = field(default_factory=dict)


def oracle_plan(arrivals: Sequence[tuple[float, float]], capacity: float, budget_s: float, lookahead_s: float,
                horizon_s: float) -> list[int]:
    """Replicas to have asked for at each whole second: max over t in [k, k + lookahead] of
    r(t) = ceil(audio arriving in (t - budget, t] / (budget x capacity)) (module docstring)."""
    n = math.ceil(horizon_s) + math.ceil(lookahead_s) + 2
    times = [a for a, _ in arrivals]
    prefix = [0.0]
    for _, w in arrivals:
        prefix.append(prefix[-1] + w)
    r = [0] * n
    for k in range(n):
        hi = bisect.bisect_right(times, float(k))
        lo = bisect.bisect_right(times, k - budget_s)
        work = prefix[hi] - prefix[lo]
        # Requests arriving within the last second still need their replica at k.
        hi1 = bisect.bisect_right(times, k + 1.0)
        work = max(work, prefix[hi1] - prefix[bisect.bisect_right(times, k + 1.0 - budget_s)])
        r[k] = math.ceil(work / (budget_s * capacity) - 1e-9) if work > 0 else 0
    out = [0] * n
    win: deque[int] = deque()
    look = math.ceil(lookahead_s)
    for k in range(n - 1, -1, -1):  # sliding max over [k, k + look]
        while win and r[win[-1]] <= r[k]:
            win.pop()
        win.append(k)
        while win[0] > k + look:
            win.popleft()
        out[k] = r[win[0]]
    return out


def make_oracle(requests: Sequence[TraceRequest]) -> Decide:
    arrivals = sorted((r.arrival_s, r.audio_s) for r in requests)
    horizon = arrivals[-1][0] if arrivals else 0.0

    def decide(s: Snapshot, spec: Autoscaling, st: OracleState, now: float) -> tuple[Decision, OracleState]:
        usable = [p for p in s.pools if p.schedulable]
        caps = {p.name: p.capacity_audio_s or 1.0 for p in s.pools}
        pools = tuple(replace(p, service_rate=caps[p.name]) for p in s.pools)
        first = next((n for n, k in place(1, pools, s.slots).items() if k), usable[0].name if usable else None)
        first_pool = next(p for p in s.pools if p.name == first)
        cap = caps[first_pool.name]
        cold = first_pool.cold_start_s or spec.cold_start_s
        budget = max(spec.slo_p95_s - (first_pool.min_latency_s or 0.0), 0.25 * spec.slo_p95_s)
        plan = st.plan
        if plan is None:
            plan = oracle_plan(arrivals, cap, budget, cold, horizon)
            st = OracleState(plan, {"capacity_audio_s": cap, "cold_start_s": cold, "budget_s": budget})
        k = min(len(plan) - 1, max(0, math.floor(now)))
        want = plan[k]
        backlog = s.pending_audio_s + sum(r.outstanding_audio_s for p in usable for r in p.replicas)
        need = math.ceil(backlog / (budget * cap) - 1e-9) if backlog > 0 else 0
        if s.pending > 0:
            need = max(need, 1)
        total = max(want, need)
        why = (f"oracle: {want} replica(s) for the audio arriving by now + cold start {cold:.0f}s, {need} for the "
               f"backlog {backlog:.1f} audio-s (capacity {cap:.2f} audio-s/s per replica, budget {budget:.1f}s)")
        return settle(s, total, why, pools=pools), st

    return decide


def make(name: str, spec: EndpointSpec, requests: Sequence[TraceRequest], coldstart: ColdStartCatalog,
         expected_cold_start: Callable[[str], float] | None = None) -> Scaler:
    """The ``Scaler`` called ``name`` (``NAMES``). Raises ValueError for another name."""
    if name == "tideserve":
        return Scaler(name, None, ScalingState(), None, True)
    if name == "keda-hpa":
        return Scaler(name, keda_hpa_decide, KedaHpaState(), HPA_SYNC_S, False)
    if name == "knative":
        return Scaler(name, knative_decide, KpaState(), KPA_TICK_S, True)
    if name == "oracle":
        return Scaler(name, make_oracle(requests), OracleState(), 1.0, True)
    raise ValueError(f"no autoscaler named {name!r}; known: {', '.join(NAMES)}")
