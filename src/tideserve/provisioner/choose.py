"""Which machines to launch for pending replicas, and which to remove: pure, like Karpenter.

``plan_launches`` places pending replicas into free capacity of existing nodes first, then
bin-packs the rest onto new nodes, each time picking the offering x capacity type with the lowest
price per replica the new node would hold. ``consolidate`` names the nodes to remove: empty ones,
then under-used ones whose replicas all fit elsewhere (Karpenter's consolidation), most expensive
first; ``replacements`` names the on-demand nodes one cheaper new node would replace (Karpenter's
consolidation by replacement). No clock (``now`` is an argument), no I/O: the runtime, the simulator and the tests drive
the same code. Prices come from ``catalog`` (sources there).

Units: prices $/h, times s. A replica needs ``accelerators_per_replica`` accelerators of its pool's
accelerator on ONE node; a CPU replica takes one slot. Ties are broken by instance type name, then
by the pool's order of capacity-type preference, so the same input gives the same output.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from collections.abc import Mapping, Sequence

from tideserve.provisioner.catalog import CAPACITY_TYPES, Offering, SpotMarket, check_capacity_type


@dataclass(frozen=True)
class ReplicaRequest:
    """``count`` replicas of ``pool`` waiting for a machine. ``capacity_types`` in the pool's order
    of preference ("on-demand", "spot"), as the pool's spec lists them."""

    pool: str
    accelerator: str
    accelerators_per_replica: int = 1
    capacity_types: tuple[str, ...] = ("on-demand",)
    count: int = 1

    def __post_init__(self) -> None:
        if self.count < 0:
            raise ValueError(f"count {self.count} of pool {self.pool!r} must be >= 0")
        if self.accelerators_per_replica < 1:
            raise ValueError(
                f"accelerators_per_replica {self.accelerators_per_replica} of pool {self.pool!r} must be >= 1")
        if not self.capacity_types:
            raise ValueError(f"capacity_types of pool {self.pool!r} is empty; list on-demand and/or spot")
        object.__setattr__(self, "capacity_types", tuple(self.capacity_types))
        for ct in self.capacity_types:
            check_capacity_type(ct, f"capacity_types of pool {self.pool!r}:")


@dataclass(frozen=True)
class Node:
    """A machine that exists (or is launching). ``replicas``: one pool name per replica on it.
    ``launched_at``: launch time, s, on the caller's clock; None for a machine the provisioner did
    not launch (the embedded local machine), which ``consolidate`` never removes."""

    name: str
    offering: Offering
    capacity_type: str
    replicas: tuple[str, ...] = ()
    launched_at: float | None = None

    def __post_init__(self) -> None:
        check_capacity_type(self.capacity_type, f"capacity_type of node {self.name!r}:")
        object.__setattr__(self, "replicas", tuple(self.replicas))


@dataclass(frozen=True)
class LaunchPlan:
    """``launches``: (offering, capacity type, pool names placed on it, one per replica).
    ``unplaceable``: (pool, replica count, reason). ``cost_usd_per_h``: total of the launches, $/h.
    ``on_existing``: (node name, pool names placed into its free capacity)."""

    launches: tuple[tuple[Offering, str, tuple[str, ...]], ...]
    unplaceable: tuple[tuple[str, int, str], ...]
    cost_usd_per_h: float
    on_existing: tuple[tuple[str, tuple[str, ...]], ...] = field(default=())


@dataclass
class _Bin:
    """Mutable working copy of a node during one planning call."""

    name: str
    offering: Offering
    capacity_type: str
    free: int
    pools: list[str]

    def fits(self, accelerator: str, need: int, allowed: Sequence[str]) -> bool:
        return self.offering.accelerator == accelerator and self.capacity_type in allowed and need <= self.free


def _bin(node: Node, need: Mapping[str, int]) -> _Bin:
    used = sum(need.get(p, 1) for p in node.replicas)
    return _Bin(node.name, node.offering, node.capacity_type, node.offering.accelerator_count - used,
                list(node.replicas))


def _check_names(nodes: Sequence[Node]) -> None:
    seen = Counter(n.name for n in nodes)
    dup = sorted(name for name, k in seen.items() if k > 1)
    if dup:
        raise ValueError(f"existing node names must be unique; repeated: {', '.join(dup)}")


def _held(o: Offering, ct: str, first: ReplicaRequest, queue: Sequence[ReplicaRequest]) -> int:
    """Replicas a new node of ``o`` / ``ct`` would hold: ``first``, then first-fit over ``queue``."""
    free, held = o.accelerator_count - first.accelerators_per_replica, 1
    for q in queue:
        if q.accelerator == o.accelerator and ct in q.capacity_types and q.accelerators_per_replica <= free:
            free -= q.accelerators_per_replica
            held += 1
    return held


def _best_new(r: ReplicaRequest, queue: Sequence[ReplicaRequest], offerings: Sequence[Offering],
              market: SpotMarket) -> tuple[tuple[Offering, str] | None, str]:
    """The cheapest (offering, capacity type) per replica held for a new node that starts with
    ``r``; or None and why nothing fits."""
    same = [o for o in offerings if o.accelerator == r.accelerator]
    if not same:
        return None, f"no offering has accelerator {r.accelerator}"
    big = [o for o in same if o.accelerator_count >= r.accelerators_per_replica]
    if not big:
        most = max(o.accelerator_count for o in same)
        return None, (f"needs {r.accelerators_per_replica} x {r.accelerator} on one node; "
                      f"the largest {r.accelerator} offering has {most}")
    best: tuple[tuple[float, str, int], Offering, str] | None = None
    for rank, ct in enumerate(r.capacity_types):
        for o in big:
            if ct == "spot" and o.instance_type in market.unavailable:
                continue
            per_replica = o.price_usd_per_h(ct, market.discount) / _held(o, ct, r, queue)
            key = (per_replica, o.instance_type, rank)
            if best is None or key < best[0]:
                best = (key, o, ct)
    if best is None:
        names = ", ".join(sorted(o.instance_type for o in big))
        return None, (f"no capacity for {r.accelerator}: tried {', '.join(r.capacity_types)}; "
                      f"no spot capacity for {names}")
    return (best[1], best[2]), ""


def plan_launches(pending: Sequence[ReplicaRequest], offerings: Sequence[Offering], market: SpotMarket,
                  existing: Sequence[Node] = (),
                  accelerators_per_replica: Mapping[str, int] | None = None) -> LaunchPlan:
    """Place ``pending`` replicas: free capacity of ``existing`` nodes first (first fit, nodes by
    name, only nodes of an allowed capacity type), then new nodes. Replicas go largest first
    (first-fit decreasing by accelerators needed); a replica that fits no node opens one of the
    offering x capacity type with the lowest $/h per replica it would hold, spot only where the
    pool allows it and ``market`` has it. ``accelerators_per_replica`` (pool -> accelerators) is
    what replicas already on ``existing`` nodes use; default: the pending request's value, else 1.
    """
    _check_names(existing)
    need = dict(accelerators_per_replica or {})
    need.update({r.pool: r.accelerators_per_replica for r in pending})
    old = [_bin(n, need) for n in sorted(existing, key=lambda n: n.name)]
    before = {b.name: len(b.pools) for b in old}
    queue = sorted((r for r in pending for _ in range(r.count)),
                   key=lambda r: (-r.accelerators_per_replica, r.accelerator, r.pool))
    new: list[_Bin] = []
    failed: Counter[tuple[str, str]] = Counter()
    while queue:
        r = queue.pop(0)
        args = (r.accelerator, r.accelerators_per_replica, r.capacity_types)
        b = next((b for b in old + new if b.fits(*args)), None)
        if b is None:
            choice, why = _best_new(r, queue, offerings, market)
            if choice is None:
                failed[(r.pool, why)] += 1
                continue
            b = _Bin(f"new-{len(new)}", choice[0], choice[1], choice[0].accelerator_count, [])
            new.append(b)
        b.free -= r.accelerators_per_replica
        b.pools.append(r.pool)
    return LaunchPlan(
        launches=tuple((b.offering, b.capacity_type, tuple(b.pools)) for b in new),
        unplaceable=tuple((pool, k, why) for (pool, why), k in failed.items()),
        cost_usd_per_h=sum(b.offering.price_usd_per_h(b.capacity_type, market.discount) for b in new),
        on_existing=tuple((b.name, tuple(b.pools[before[b.name]:])) for b in old if len(b.pools) > before[b.name]),
    )


def consolidate(nodes: Sequence[Node], market: SpotMarket, now: float, min_age_s: float = 0.0,
                accelerators_per_replica: Mapping[str, int] | None = None,
                capacity_types: Mapping[str, Sequence[str]] | None = None) -> tuple[str, ...]:
    """Names of nodes to remove, in the order to remove them. Only nodes launched at least
    ``min_age_s`` seconds before ``now`` (and not ``launched_at`` None) are candidates. First every
    empty candidate; then, most expensive ($/h at ``market``) first, each candidate whose replicas
    all fit into the free capacity of the other remaining nodes of the same accelerator (of a
    capacity type the pool allows: ``capacity_types`` pool -> allowed, default any); those moves
    are counted before the next candidate, so no replica is left without a place. Ties by name.
    ``accelerators_per_replica``: pool -> accelerators one replica uses (default 1)."""
    if min_age_s < 0:
        raise ValueError(f"min_age_s {min_age_s} must be >= 0")
    _check_names(nodes)
    need = dict(accelerators_per_replica or {})
    allowed = {k: tuple(v) for k, v in (capacity_types or {}).items()}
    bins = {n.name: _bin(n, need) for n in nodes}
    by_price = sorted(nodes, key=lambda n: (-n.offering.price_usd_per_h(n.capacity_type, market.discount), n.name))
    candidates = [n for n in by_price if n.launched_at is not None and now - n.launched_at >= min_age_s]
    removed = [n.name for n in candidates if not n.replicas]
    for n in candidates:
        if not n.replicas:
            continue
        others = [bins[m] for m in sorted(bins) if m != n.name and m not in removed
                  and bins[m].offering.accelerator == n.offering.accelerator]
        free = {b.name: b.free for b in others}
        moves: list[tuple[_Bin, str]] = []
        for pool in sorted(bins[n.name].pools, key=lambda p: (-need.get(p, 1), p)):
            k, ok = need.get(pool, 1), allowed.get(pool, CAPACITY_TYPES)
            b = next((b for b in others if b.capacity_type in ok and k <= free[b.name]), None)
            if b is None:
                break
            free[b.name] -= k
            moves.append((b, pool))
        else:
            for b, pool in moves:
                b.free -= need.get(pool, 1)
                b.pools.append(pool)
            removed.append(n.name)
    return tuple(removed)


def replacements(nodes: Sequence[Node], shapes: Mapping[str, ReplicaRequest], offerings: Sequence[Offering],
                 market: SpotMarket, now: float, min_age_s: float = 0.0) -> tuple[str, ...]:
    """Names of on-demand nodes to replace, most expensive first: those launched at least
    ``min_age_s`` before ``now`` whose replicas ONE new node (``plan_launches`` for them alone)
    would hold for less per hour at ``market``, e.g. on spot again once spot has capacity.
    ``shapes``: pool -> one replica's request (accelerator, accelerators, allowed capacity types;
    ``count`` ignored); a node with a pool missing there is left alone.

    Karpenter's consolidation by replacement (its design, designs/consolidation.md, "Node
    Replacement": launch the cheaper node and, when it is ready, delete the expensive one); the
    caller does the make-before-break. Spot-to-spot replacement, behind a Karpenter feature gate,
    is not proposed."""
    if min_age_s < 0:
        raise ValueError(f"min_age_s {min_age_s} must be >= 0")
    _check_names(nodes)
    out = []
    for n in sorted(nodes, key=lambda n: (-n.offering.price_usd_per_h(n.capacity_type, market.discount), n.name)):
        if (n.capacity_type != "on-demand" or not n.replicas or n.launched_at is None
                or now - n.launched_at < min_age_s or any(p not in shapes for p in n.replicas)):
            continue
        counts = Counter(n.replicas)
        plan = plan_launches([ReplicaRequest(shapes[p].pool, shapes[p].accelerator, shapes[p].accelerators_per_replica,
                                             shapes[p].capacity_types, k) for p, k in sorted(counts.items())],
                             offerings, market)
        if not plan.unplaceable and len(plan.launches) == 1 and \
                plan.cost_usd_per_h < n.offering.price_usd_per_h(n.capacity_type, market.discount) - 1e-9:
            out.append(n.name)
    return tuple(out)

