"""The autoscaling policy, a pure function of a snapshot, the spec, its state and ``now``.

``decide(snapshot, spec, state, now) -> (decision, state)``; no clock, no I/O, so the control
loop, the simulator and the tests drive the same code.

Rules (defaults from the Kubernetes HPA documentation, kubernetes.io, and KEDA's, keda.sh):

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

With ``autoscaling.metric: work`` the rules are those of ``decide_work`` (below): capacity in
audio seconds per second, the backlog in audio seconds, the SLO, cold starts and a learned
keep-alive.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from collections.abc import Mapping

from tideserve.core import ARRIVAL_BIN_S, ARRIVAL_HISTORY_S, IAT_EDGES_S, RATE_TAU_S
from tideserve.spec.models import Autoscaling


@dataclass(frozen=True)
class ReplicaSnapshot:
    """One replica counted as capacity (draining replicas are not listed). ``wanted_at``: when
    it was asked for (same clock as ``now``; a starting replica is expected ready at
    ``wanted_at + cold_start_s``)."""

    id: str
    state: str  # starting | ready (a ReplicaState value)
    outstanding: int = 0
    outstanding_audio_s: float = 0.0
    wanted_at: float | None = None


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
    capacity_audio_s: float | None = None  # audio s per s one replica serves at the batch sizes reached
    cold_start_s: float | None = None  # measured wanted -> ready (None: the spec's assumption)
    min_latency_s: float | None = None  # service time of a lone request (None: unknown, 0)


@dataclass(frozen=True)
class Snapshot:
    """What the gateway and the runtime know at ``now``. ``last_arrival`` is on the same clock
    as ``now`` (None: no request ever). ``slots`` caps the total (embedded: replica_slots)."""

    pending: int
    in_flight: int
    last_arrival: float | None
    pools: tuple[PoolSnapshot, ...]
    slots: int | None = None
    pending_audio_s: float = 0.0  # work held at the gateway
    arrival_rate_audio_s: float = 0.0  # audio s arriving per s (recent)
    iat_histogram: tuple[int, ...] = ()  # counts per core.IAT_EDGES_S bin, last: out of bounds
    arrival_rate_at: float | None = None  # arrival_rate_audio_s as of this time (decayed to now here)
    answers: tuple[tuple[int, int, int, int], ...] = ()  # core.LoadTracker.answer_history


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


def _make_before_break(desired: dict[str, int], pools: tuple[PoolSnapshot, ...], slots: int | None,
                       why: str) -> tuple[dict[str, int], str]:
    """Ready replicas that placement moves to another pool are kept until the replicas replacing
    them are ready (a rollout's maxUnavailable 0): a pool's desired count is not cut below its
    ready replicas while another pool waits for its own (desired above ready). Without this, a
    warm replica of a dearer pool was drained the moment a cheaper one was asked for, and
    requests waited its whole cold start (bench/reports/sim-azure-code-gpu: 4.3 minutes of
    large-v3 on a new node). Not applied where it would need slots the machine lacks."""
    ready = {p.name: sum(r.state == "ready" for r in p.replicas) for p in pools}
    waiting = [p.name for p in pools if p.schedulable and desired.get(p.name, 0) > ready[p.name]]
    if not waiting:
        return desired, why
    out = dict(desired)
    for p in pools:
        keep = min(ready[p.name], p.max_replicas)
        if p.schedulable and out.get(p.name, 0) < keep:
            if slots is not None and sum(out.values()) + keep - out.get(p.name, 0) > slots:
                continue
            why += (f"; keeps {keep} ready replica(s) of {p.name} until {', '.join(waiting)} "
                    "has its new ones ready (make before break)")
            out[p.name] = keep
    return out, why


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
    """One autoscaling decision (rules by ``spec.metric``). Pure: the same inputs give the
    same outputs."""
    if spec.metric == "work":
        return decide_work(snapshot, spec, state, now)
    return decide_requests(snapshot, spec, state, now)


def decide_requests(
    snapshot: Snapshot, spec: Autoscaling, state: ScalingState, now: float
) -> tuple[Decision, ScalingState]:
    """Rules 1-5 of the module docstring (``metric: requests_per_replica``)."""
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
    desired, why = _make_before_break(desired, pools, snapshot.slots, why)
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


# -- the work metric ------------------------------------------------------------------------

#: Shahrad et al., "Serverless in the Wild" (USENIX ATC 2020), hybrid histogram policy: the
#: keep-alive is the histogram's 99th percentile of inter-arrival times plus a 10% margin; a
#: histogram with too few samples, or most of them out of bounds, is not representative and
#: the fixed keep-alive applies instead.
KEEP_ALIVE_PERCENTILE = 99.0
KEEP_ALIVE_MARGIN = 0.10
KEEP_ALIVE_MIN_SAMPLES = 20
#: The share of gaps the paper's keep-alive leaves beyond it.
KEEP_ALIVE_TAIL = 1 - KEEP_ALIVE_PERCENTILE / 100.0


def learned_keep_alive(hist: tuple[int, ...], edges: tuple[float, ...],
                       tail: float = KEEP_ALIVE_TAIL) -> float | None:
    """The hybrid-histogram keep-alive (s) from inter-arrival counts per bin (``edges`` upper
    edges, a last out-of-bounds bin): the upper edge of the bin holding the (1 - ``tail``)
    quantile (the 99th percentile by default), plus 10%. None when not representative: fewer
    than 20 gaps, that quantile out of bounds, or a tail below the default one that the gaps
    cannot show (fewer than 1 / ``tail`` of them: a gap longer than any seen comes about once
    in n + 1 arrivals)."""
    n = sum(hist)
    if n < KEEP_ALIVE_MIN_SAMPLES:
        return None
    if tail < KEEP_ALIVE_TAIL and n * tail < 1:
        return None
    need = max(1, math.ceil((1.0 - tail) * n - 1e-9))
    seen = 0
    for i, c in enumerate(hist):
        seen += c
        if seen >= need:
            if i >= len(edges):
                return None
            return edges[i] * (1 + KEEP_ALIVE_MARGIN)
    return None


def requests_per_cold_start(hist: tuple[int, ...], edges: tuple[float, ...], cold_start_s: float) -> float:
    """Requests expected to wait out one cold start from zero: the first arrival after the
    scale to zero, and the run of arrivals after it each within a cold start of the one before,
    1 / (1 - F) for F the share of inter-arrival gaps (``hist`` over ``edges``) that are at most
    ``cold_start_s`` (a geometric run; an estimate that counts long runs in full). ``math.inf``
    when every gap seen is shorter than a cold start; 1.0 for an empty histogram."""
    n = sum(hist)
    if n == 0:
        return 1.0
    short = sum(c for c, edge in zip(hist, edges, strict=False) if edge <= cold_start_s)
    return math.inf if short >= n else n / (n - short)


def slo_floor(answers: tuple[tuple[int, int, int, int], ...], now: float, miss_share: float,
              bin_s: float = ARRIVAL_BIN_S, history_s: float = ARRIVAL_HISTORY_S) -> tuple[int, float]:
    """The SLO term of ``decide_work``: ``(floor, late share)`` from the endpoint's own answers.

    ``answers``: ``(bin, ready replicas, answered, late)`` (``core.LoadTracker.answer_history``:
    the ready count is the one each request met when it arrived); entries before
    ``now - history_s`` are ignored. A ready count k was too few when its late answers alone
    exceed ``miss_share`` of all answers over the history, and it is the smallest count seen or
    its late rate (late / answered at k) is below that of the next smaller count seen: more
    replicas helped, so one more may help again; where they did not (misses that capacity does
    not cure: a slow upload, a lone request near the SLO), the floor stops climbing. The floor is
    one more than the largest such k (0 when none, or no answers); the late share is late /
    answered over the history. Raises ValueError for ``miss_share`` outside [0, 1).

    A closed loop on what users saw rather than a model of the traffic: a fluid queue replaying
    the arrival history at the profile's capacity was tried first and misjudged both ways (it saw
    no miss in a large-v3 burst that missed 47 requests, and 30% late work on a CPU trace that met
    the SLO with one replica), as did sizing for the recurring bursts' work (docs/autoscaling.md)."""
    if not 0.0 <= miss_share < 1.0:
        raise ValueError(f"miss_share {miss_share} must be in [0, 1)")
    first = (now - history_s) / bin_s
    total, late_all = 0, 0
    by_ready: dict[int, list[int]] = {}
    for k, ready, n, late in answers:
        if k < first:
            continue
        total += n
        late_all += late
        seen = by_ready.setdefault(ready, [0, 0])
        seen[0] += n
        seen[1] += late
    if total == 0:
        return 0, 0.0
    floor, prev_rate = 0, None
    for ready in sorted(by_ready):
        n, late = by_ready[ready]
        rate = late / n
        if late > miss_share * total and (prev_rate is None or rate < prev_rate):
            floor = ready + 1
        prev_rate = rate
    return floor, late_all / total


def drain_time_s(work_s: float, arrival_rate: float, ready_capacity: float,
                 starting: list[tuple[float, float]]) -> float:
    """Seconds until a backlog of ``work_s`` audio seconds is served, with work arriving at
    ``arrival_rate`` (audio s/s), ``ready_capacity`` now, and ``starting`` replicas adding
    ``capacity`` at ``ready_in_s`` each ((ready_in_s, capacity) pairs). ``math.inf`` when the
    capacity never exceeds the arrivals."""
    if work_s <= 0:
        return 0.0
    t, w, cap = 0.0, work_s, ready_capacity
    for ready_in, c in [*sorted(starting), (math.inf, 0.0)]:
        net = cap - arrival_rate
        if net > 0 and t + w / net <= ready_in:
            return t + w / net
        if ready_in == math.inf:
            return math.inf
        w -= net * (ready_in - t)
        t, cap = ready_in, cap + c
    return math.inf  # pragma: no cover - the loop returns at the sentinel


def decide_work(
    snapshot: Snapshot, spec: Autoscaling, state: ScalingState, now: float
) -> tuple[Decision, ScalingState]:
    """Scale on work and the latency SLO (``metric: work``).

    1. Capacity of a replica: ``capacity_audio_s`` of its pool (audio seconds served per second
       at the batch sizes reached: the simulator passes the profile's, the gateway its measured
       throughput); a pool without one takes the mean of the others (1.0 if none).
    2. Backlog W = audio seconds held at the gateway + outstanding on replicas; arrivals
       lambda (audio s/s, recent). Capacity needed = max(lambda / target_utilization,
       W / (slo_p95_s - min latency)): steady arrivals below the utilization target, and the
       backlog served within the SLO. Replicas needed: the fewest, placed by ``place``
       (cheapest per unit of capacity first), whose capacity covers it.
    3. Starting replicas count as capacity. More replicas are asked for only when the first new
       one would be ready (the pool's cold start) before the backlog drains without it
       (``drain_time_s``: ready capacity now, starting replicas when they are expected ready);
       a burst shorter than a cold start asks for none.
    4. Held requests at zero replicas: at least one replica at once (activation).
       The SLO term (bursts): when a cold start is longer than the SLO budget, a replica asked
       for at a burst comes after it, so what users saw decides: a count of ready replicas (met
       at arrival) whose late answers (after ``slo_p95_s``, or refused) alone exceed
       1 - ``slo_attainment`` of the answers over the last ``core.ARRIVAL_HISTORY_S`` was too
       few, and at least one more is kept (``slo_floor``: only while more replicas helped)
       until those answers leave the history.
    5. Scale-down: to the highest recommendation over ``scale_down_stabilization_s``.
    6. Scale to zero once nothing is outstanding and no request arrived for the keep-alive:
       when a cold start (plus the lone-request latency) still meets the SLO, the break-even
       of idle cost against cold-start cost: an idle replica costs its price per second; a
       cold start costs the same price over the cold start (the node is billed while it boots
       and loads), so idling is cheaper for gaps shorter than the cold start: keep-alive =
       cold start. When a cold start would break the SLO, the keep-alive is learned from the
       endpoint's inter-arrival times (``learned_keep_alive``; Shahrad et al. ATC 2020) and at
       least the break-even; ``scale_to_zero_after_s`` is its ceiling and the fallback when the
       histogram is not representative. The paper's 99th percentile is raised to fit the SLO's
       miss budget: each scale to zero makes ``requests_per_cold_start`` (m) requests wait a
       cold start, and a share q of arrivals come after a gap longer than the keep-alive, so
       misses per request are m x q; the keep-alive is the (1 - q) quantile of the gaps for
       q = (1 - ``slo_attainment``) / m (the 99th percentile when m x 0.01 fits the budget);
       a q the histogram cannot show (fewer than 1 / q gaps) falls back to the ceiling.
    7. min/max per pool and ``slots`` as in ``place``.
    """
    usable = [p for p in snapshot.pools if p.schedulable]
    known = [p.capacity_audio_s for p in usable if p.capacity_audio_s]
    default_cap = sum(known) / len(known) if known else 1.0
    cap = {p.name: (p.capacity_audio_s or default_cap) for p in snapshot.pools}
    cold = {p.name: (p.cold_start_s if p.cold_start_s is not None else spec.cold_start_s) for p in snapshot.pools}
    pools = tuple(dataclasses.replace(p, service_rate=cap[p.name]) for p in snapshot.pools)
    ceiling = sum(p.max_replicas for p in usable)
    if snapshot.slots is not None:
        ceiling = min(ceiling, snapshot.slots)
    min(sum(p.min_replicas for p in usable), ceiling)

    ready_cap = 0.0
    starting: list[tuple[float, float]] = []
    work = snapshot.pending_audio_s
    current = 0
    for p in usable:
        for r in p.replicas:
            current += 1
            work += r.outstanding_audio_s
            if r.state == "ready":
                ready_cap += cap[p.name]
            else:
                waited = 0.0 if r.wanted_at is None else max(0.0, now - r.wanted_at)
                starting.append((max(0.0, cold[p.name] - waited), cap[p.name]))
    lam = snapshot.arrival_rate_audio_s
    if snapshot.arrival_rate_at is not None:
        lam *= math.exp(-max(0.0, now - snapshot.arrival_rate_at) / RATE_TAU_S)
    lat0 = max((p.min_latency_s or 0.0 for p in usable), default=0.0)
    budget = max(spec.slo_p95_s - lat0, 0.25 * spec.slo_p95_s)
    need = max(lam / spec.target_utilization, work / budget)

    def fewest(capacity: float) -> int:
        """The fewest replicas, placed by ``place``, whose capacity covers ``capacity``."""
        n = 0
        while n < ceiling:
            got = place(n, pools, snapshot.slots)
            if sum(k * cap[name] for name, k in got.items()) >= capacity - 1e-9:
                break
            n += 1
        return n

    n_need = fewest(need)
    first = next((name for name, k in place(max(1, current + 1), pools, snapshot.slots).items()
                  if k > sum(1 for p in usable if p.name == name for _ in p.replicas)), None)
    cs_new = cold[first] if first is not None else min(cold.values(), default=spec.cold_start_s)
    t_drain = drain_time_s(work, lam, ready_cap, starting)
    nums = (f"backlog {work:.1f} audio-s, arrivals {lam:.2f} audio-s/s, capacity ready {ready_cap:.2f} + starting "
            f"{sum(c for _, c in starting):.2f} audio-s/s, need {need:.2f} ({n_need} replica(s))")

    if current == 0 and snapshot.pending > 0:
        raw = max(1, n_need)
        why = f"activation: {snapshot.pending} request(s) held at zero replicas; {nums}"
    elif n_need > current:
        if t_drain > cs_new:
            raw = n_need
            drain_txt = "never" if t_drain == math.inf else f"in {t_drain:.1f}s"
            why = f"{nums}; without more the backlog drains {drain_txt} > cold start {cs_new:.1f}s: scale up"
        else:
            raw = current
            why = (f"{nums}; the backlog drains in {t_drain:.1f}s without more, before a new replica "
                   f"(cold start {cs_new:.1f}s) would be ready: no new replica")
    else:
        raw = n_need
        why = nums
    # The SLO term: ready counts that left too many answers late, when a replica asked for at a
    # burst would come after it.
    floor, late_share = (slo_floor(snapshot.answers, now, 1.0 - spec.slo_attainment)
                         if cs_new > budget and snapshot.answers else (0, 0.0))
    if floor > raw:
        why += (f"; {late_share:.2%} of the answers over the last {ARRIVAL_HISTORY_S / 60:.0f} min came after the "
                f"SLO ({spec.slo_p95_s:g}s), more than {1.0 - spec.slo_attainment:.2%} with {floor - 1} replica(s) "
                f"ready: at least {floor} kept, since a cold start ({cs_new:.1f}s) is longer than the budget "
                f"{budget:.1f}s")
        raw = floor

    since = None if snapshot.last_arrival is None else now - snapshot.last_arrival
    # Break-even: the cold start of the replica a scale from zero would start.
    zero_first = next((name for name, k in place(1, pools, snapshot.slots).items() if k), None)
    be = cold[zero_first] if zero_first is not None else spec.cold_start_s
    slo_safe = be + lat0 <= spec.slo_p95_s
    hist = snapshot.iat_histogram
    caught = requests_per_cold_start(hist, IAT_EDGES_S, be) if hist else 1.0
    tail = min(KEEP_ALIVE_TAIL, (1.0 - spec.slo_attainment) / caught)
    learned = learned_keep_alive(hist, IAT_EDGES_S, tail) if hist else None
    if slo_safe:
        keep_alive, ka_why = min(be, spec.scale_to_zero_after_s), f"break-even = cold start {be:.1f}s (meets the SLO)"
    elif learned is not None:
        keep_alive = min(max(learned, be), spec.scale_to_zero_after_s)
        ka_why = (f"learned p{100 * (1 - tail):.4g} inter-arrival {learned:.1f}s ({caught:.3g} request(s) per cold "
                  f"start, SLO attainment {spec.slo_attainment:g}), at least the break-even {be:.1f}s")
    else:
        n = sum(hist)
        ka_why = ("too few inter-arrival samples" if n < KEEP_ALIVE_MIN_SAMPLES or tail >= KEEP_ALIVE_TAIL else
                  f"{n} gaps cannot show the {tail:.2g} tail the SLO budget needs ({caught:.3g} request(s) per cold "
                  f"start)") + ": scale_to_zero_after_s"
        keep_alive = spec.scale_to_zero_after_s
    keep_alive_txt = f"keep-alive {keep_alive:.1f}s ({ka_why}, ceiling {spec.scale_to_zero_after_s:g}s)"
    idle = since is None or since >= keep_alive
    outstanding = work > 0 or snapshot.in_flight > 0 or snapshot.pending > 0
    if not idle and raw < 1:
        raw = 1
        why += f"; last arrival {since:.1f}s ago < {keep_alive_txt}"

    window = [(t, v) for t, v in state.recommendations if now - t < spec.scale_down_stabilization_s]
    window.append((now, raw))
    if idle and not outstanding:
        total = 0
        why = ("no request arrival" + (f" for {since:.1f}s" if since is not None else " yet") +
               f" >= {keep_alive_txt}: scale to the pools' minimum")
    elif raw < current:
        total = min(current, max(v for _, v in window))
        if total > raw:
            why += f"; held at {total} by the {spec.scale_down_stabilization_s:g}s stabilization window"
    else:
        total = raw
    decision = settle(snapshot, total, why, pools=pools, inputs={
                "pending": snapshot.pending, "in_flight": snapshot.in_flight, "current": current,
                "backlog_audio_s": round(work, 3), "arrival_rate_audio_s": round(lam, 4),
                "capacity_ready_audio_s": round(ready_cap, 4), "need_audio_s": round(need, 4),
                "drain_time_s": None if t_drain == math.inf else round(t_drain, 3),
                "cold_start_s": round(cs_new, 3), "keep_alive_s": round(keep_alive, 3),
                "late_share": round(late_share, 5), "slo_floor": floor,
                "since_last_arrival_s": None if since is None else round(since, 3), "recommendation": raw})
    return decision, ScalingState(tuple(window))


def settle(snapshot: Snapshot, total: int, why: str, pools: tuple[PoolSnapshot, ...] | None = None,
           inputs: Mapping[str, float | int | None] | None = None) -> Decision:
    """The decision for ``total`` replicas: clamped to the pools' mins and maxima (and slots),
    placed by ``place``, the least-loaded extra replicas drained. ``pools`` overrides the
    snapshot's (e.g. with service rates in another unit); baselines use this too."""
    pools = snapshot.pools if pools is None else pools
    usable = [p for p in pools if p.schedulable]
    ceiling = sum(p.max_replicas for p in usable)
    if snapshot.slots is not None:
        ceiling = min(ceiling, snapshot.slots)
    floor = min(sum(p.min_replicas for p in usable), ceiling)
    clamped = max(floor, min(ceiling, total))
    if clamped != total:
        why += f"; clamped to [{floor}, {ceiling}]"
    desired = place(clamped, pools, snapshot.slots)
    desired, why = _make_before_break(desired, pools, snapshot.slots, why)
    drain: list[str] = []
    for p in pools:
        drain += _to_drain(p, desired[p.name] if p.schedulable else 0)
    return Decision(desired=desired, drain=tuple(drain), total=sum(desired.values()), reason=why,
                    inputs=dict(inputs or {}))
