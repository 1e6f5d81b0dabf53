"""Discrete-event replay of a request trace through tideserve's own policies, on a virtual clock.

One run replays a list of requests against one ``EndpointSpec`` and returns what happened to each
request, each machine and the replica counts over time. The decisions are made by the live code,
imported here and called with the virtual time (``POLICY`` lists them; tests check they are called):

- routing: ``tideserve.gateway.router.choose_replica`` over ``ReplicaView`` values (outstanding
  requests, ``max_concurrency``, time last chosen, each pool's service rate as the gateway measures
  it: 1 / moving average of service time with the gateway's ``EWMA_ALPHA``);
- the serving core (``tideserve.core``, the same the gateway uses): replica states and records,
  load tracking (``LoadTracker``: outstanding requests and audio seconds, service rates, the
  inter-arrival histogram, cold starts), the FIFO ``HoldQueue`` (``may_hold`` / ``hold_deadline``:
  ``max_pending``, ``hold_timeout_s``) and ``plan_apply``; a held request triggers an autoscaler
  decision at once (activation) when the policy wakes on holds;
- batching: ``tideserve.worker.batching.next_batch`` per replica (which calls ``cut_batch``)
  (``max_batch_size``, ``max_queue_delay_ms``) on up to ``instances`` model instances, as the
  worker's engine does (``batching.instances``, default ``worker.engine.default_instances`` of the
  CPU cores; one for the torch backend, whose continuous batching is modelled as one execution at
  a time). An execution's work is the profile's service time for its batch size and longest
  window, measured alone on the machine. Executions that run at once share what they run on: on
  a CPU pool, the machine's ``RunOptions.cpu_cores`` (all replicas of the machine: embedded mode
  puts them on one), each execution asking for the backend's intra-op threads
  (``worker.cores.intra_op_threads``) but keeping only c(b) = min(threads, c1 x b) cores busy
  for a batch of b windows, c1 the pool profile's ``busy_cores_per_window`` (measured by running
  lone requests at once: bench/profile_e2e.py; default: all its threads); each execution runs at
  min(1, cores / sum of c(b) over the executions) of its measured speed (processor sharing), and
  a long caller's batch in the background lane (``batching.background_nice``) at its nice value's
  weight in that sharing (``weighted_speeds``).
  Measured on 2 cores (int8), three lone tiny.en requests at once took 1.09x what they take
  alone and four 1.48x (c1 = 0.73: a batch-1 decode does not keep its 2 threads busy); taking
  every execution as keeping all its threads busy put the validation's p50 at 2.2x the real one
  (3.75 s against 1.7 s). On a GPU pool:
  its replica's GPU, at 1 / executions. An execution's work is drawn from the measured samples
  of the nearest profile point (work = the interpolated median x a sample / that point's median,
  from a generator of its own derived from the run's seed): the samples of an end-to-end profile are other
  speech each, and a window's decode time depends on what it says (one 15 s window 1.1-4.2 s);
- autoscaling: ``tideserve.autoscaler.policy.decide`` every ``autoscaling.interval_s`` and on
  activation, or a baseline of ``tideserve.sim.baselines`` (``RunOptions.autoscaler``) at its
  own interval; its ``desired``/``drain`` are applied through ``core.plan_apply`` (drain the
  named replicas, start replicas up to ``desired``);
- machines: ``tideserve.provisioner.plan_launches`` for replicas waiting for a machine (after a
  Karpenter batch window) and ``tideserve.provisioner.consolidate`` every tick.

Modelled simply (documented limits): audio over 30 s becomes ceil(d / 30) windows of one request;
Whisper's extra "tail" decoding rounds are not modelled; consolidation only removes empty nodes
(replicas are not moved). A spot interruption notice makes the node's ready replicas ``LEAVING``
(``core.ReplicaState``): they serve on, the autoscaler asks for replacements, and each drains when
a replacement in its pool is ready or ``spot_drain_margin_s`` before the termination (make before
break; it drained them at the notice before, which left a pool of one replica with nothing while
its replacement booted); requests still on them at termination are retried through the gateway.

Cluster modes: ``"aws"``: GPU pools launch AWS offerings of the provisioner's catalog; each CPU pool
gets its own CPU node type ("cpu-<pool>", one replica per node, priced at the pool's
``cost_usd_per_h``, booting in ``CPU_NODE_BOOT_S``). ``"local"``: embedded mode, one machine with
``replica_slots`` slots that is already up; replicas start in the catalog's embedded start time.

The clock is a plain event heap (``heapq``), not simpy: every decision is a pure function called
at an event time, so the simulator needs ordered events and nothing of simpy's process model.
"""

from __future__ import annotations

import collections
import heapq
import math
import random
from dataclasses import dataclass, field
from typing import Literal
from collections.abc import Callable, Mapping, Sequence

from tideserve import core
from tideserve.autoscaler import policy as autoscaler_policy
from tideserve.autoscaler.policy import PoolSnapshot, ReplicaSnapshot, Snapshot
from tideserve.core import HoldQueue, LoadTracker, ReplicaRecord, plan_apply
from tideserve.core import ReplicaState as RS
from tideserve.gateway import router
from tideserve.gateway.router import ReplicaView
from tideserve.provisioner import catalog as prov_catalog
from tideserve.provisioner import choose as prov_choose
from tideserve.provisioner.catalog import CPU_NODE_BOOT_S, Offering, SpotMarket
from tideserve.provisioner.choose import Node, ReplicaRequest
from tideserve.sim.coldstart import ColdStartCatalog
from tideserve.sim.errors import SimInputError
from tideserve.sim.profile import PoolProfile
from tideserve.sim.trace import TraceRequest
from tideserve.spec.models import EndpointSpec
from tideserve.worker import batching
from tideserve.worker.cores import intra_op_threads
from tideserve.worker.engine import default_instances

WINDOW_S = 30.0


def _policy() -> dict[str, Callable]:
    """The live policy functions the simulator calls, looked up at call time (so a test can spy
    on them with monkeypatch)."""
    return {
        "choose_replica": router.choose_replica,
        "may_hold": core.may_hold,
        "hold_deadline": core.hold_deadline,
        "next_batch": batching.next_batch,
        "decide": autoscaler_policy.decide,
        "place": autoscaler_policy.place,
        "plan_launches": prov_choose.plan_launches,
        "consolidate": prov_choose.consolidate,
        "replacements": prov_choose.replacements,
    }


#: Names of the live functions used (see ``_policy``).
POLICY = tuple(_policy())


@dataclass(frozen=True)
class RunOptions:
    """Settings of one run that are not in the endpoint spec.

    ``static``: pool -> replicas kept running the whole time (the autoscaler is not called);
    None: tideserve autoscaling. ``warm``: pool -> replicas already ready at t = 0 (default: the
    pools' ``replicas.min``, or ``static``). ``spot_interruption_rate_per_h``: interruptions per
    spot node-hour (exponential inter-arrival times from the seeded RNG). ``spot_discount``:
    fraction off on-demand (``SpotMarket``; an assumption). ``cpu_cores``: cores of the machine a
    CPU replica runs on (the local machine, or one CPU pool node), which the executions on it
    share; pass the CPU profile's ``metadata.cpus`` (it was measured with those).
    """

    cluster: Literal["aws", "local"] = "aws"
    replica_slots: int = 4
    local_cost_usd_per_h: float = 0.0
    static: dict[str, int] | None = None
    warm: dict[str, int] | None = None
    seed: int = 0
    spot_discount: float = 0.6
    spot_interruption_rate_per_h: float = 0.0
    coldstart: ColdStartCatalog = field(default_factory=ColdStartCatalog)
    offerings: tuple[Offering, ...] = prov_catalog.AWS_US_EAST_1
    autoscaler: str = "tideserve"  # tideserve (policy.decide) | a baseline of tideserve.sim.baselines
    cpu_cores: int = 2  # cores of a CPU replica's machine, shared by its executions (the CPU profile's)


@dataclass
class RequestOutcome:
    """What became of one request: ``status`` ok | rejected (max_pending) | timeout (held past
    hold_timeout_s); ``latency_s`` arrival -> last window done (None unless ok); ``held`` whether
    it waited at the gateway; ``pool`` of the replica that answered; ``retries`` after a spot
    termination."""

    id: int
    arrival_s: float
    audio_s: float
    status: str = "pending"
    latency_s: float | None = None
    held: bool = False
    pool: str | None = None
    retries: int = 0


@dataclass
class NodeRecord:
    """One machine: its offering, capacity type, price ($/h at launch), when it started billing
    and stopped (s), and why it ended (consolidated | interrupted | end)."""

    name: str
    instance_type: str
    accelerator: str
    accelerators: int
    capacity_type: str
    price_usd_per_h: float
    launched_s: float
    ended_s: float | None = None
    end_reason: str = ""


@dataclass
class RunResult:
    """A run's record: per request, per node, samples over time ``(t, load, ready replicas by
    pool, all replicas, nodes)``, busy seconds by accelerator kind, counts of replica starts (cold
    starts after t = 0), spot interruptions and retries, and the end time (s)."""

    requests: list[RequestOutcome]
    nodes: list[NodeRecord]
    timeline: list[tuple[float, int, dict[str, int], int, int]]
    busy_s: dict[str, float]
    replica_starts: int
    spot_interruptions: int
    end_s: float
    decisions: int


#: Linux's CPU weight of a thread at nice 0..19 (``sched_prio_to_weight`` in kernel/sched/core.c:
#: each step about 1.25x, so that one nice level is about 10% of the CPU between two threads).
NICE_WEIGHTS = (1024, 820, 655, 526, 423, 335, 272, 215, 172, 137, 110, 87, 70, 56, 45, 36, 29, 23, 18, 15)


def nice_weight(nice: int) -> float:
    """The CPU weight of a thread at ``nice`` (0..19; ``NICE_WEIGHTS``). Raises IndexError
    outside 0..19 (the spec's ``background_nice`` range)."""
    if not 0 <= nice < len(NICE_WEIGHTS):
        raise IndexError(f"nice {nice} is outside 0..19")
    return float(NICE_WEIGHTS[nice])


def weighted_speeds(demand: list[tuple[float, float]], cores: float) -> list[float]:
    """Each execution's speed (0-1 of its speed alone) when executions wanting ``(cores busy,
    weight)`` share ``cores``: the scheduler gives each a share of the cores in proportion to its
    threads' weight, and what an execution cannot use (it runs at full speed) goes to the others
    (water-filling). With equal weights: min(1, cores / total demand) for every execution."""
    speeds = [0.0] * len(demand)
    left, open_ = float(cores), [i for i, (d, _) in enumerate(demand) if d > 0]
    for i, (d, _) in enumerate(demand):
        if d <= 0:
            speeds[i] = 1.0
    while open_:
        total = sum(demand[i][0] * demand[i][1] for i in open_)
        full = [i for i in open_ if left * demand[i][1] / total >= 1.0]
        if not full:
            for i in open_:
                speeds[i] = left * demand[i][1] / total
            break
        for i in full:
            speeds[i] = 1.0
            left -= demand[i][0]
        open_ = [i for i in open_ if i not in full]
        left = max(left, 1e-9)  # others remain only when the full ones took less than ``left``
    return speeds


@dataclass
class _Execution:
    """One batch executing: the request id of each of its windows, the work left in seconds at
    the speed it was measured (alone on the machine), its current speed (0-1: the share of the
    machine it gets) and a token that invalidates its completion event when the speed changes."""

    ids: tuple[int, ...]
    work_s: float
    since: float
    audio_s: float = 0.0  # its longest window
    background: bool = False  # a long caller's batch (``batching.next_batch``)
    speed: float = 1.0
    token: int = 0

    @property
    def size(self) -> int:
        return len(self.ids)


@dataclass
class _Replica:
    """The core's record of a replica plus what only the simulator has: its machine and its
    worker's batch queue."""

    rec: ReplicaRecord
    node: str | None = None
    queue: list[tuple[int, float, float]] = field(default_factory=list)  # (request id, enqueued, audio_s)
    executions: list[_Execution] = field(default_factory=list)
    wake_token: int = 0
    requests: set[int] = field(default_factory=set)

    @property
    def id(self) -> str:
        return self.rec.id

    @property
    def pool(self) -> str:
        return self.rec.pool

    @property
    def state(self) -> RS:
        return self.rec.state

    @property
    def outstanding(self) -> int:
        return self.rec.outstanding

    @property
    def executing(self) -> bool:
        return bool(self.executions)


@dataclass
class _Node:
    rec: NodeRecord
    offering: Offering
    ready_at: float
    replicas: list[str] = field(default_factory=list)
    image_ready_at: float | None = None
    empty_since: float | None = None
    interrupted: bool = False


@dataclass
class _Req:
    out: RequestOutcome
    windows: list[float]
    left: int = 0
    replica: str | None = None
    dispatched_at: float = 0.0
    hold_token: int = 0
    ready_at_arrival: int = 0  # replicas ready when it arrived (the SLO term's count)


def profiles_for(spec: EndpointSpec, profiles: Sequence[PoolProfile]) -> dict[str, PoolProfile]:
    """Each pool's profile: the one measured for that pool and target, else any of the same
    target. Raises SimInputError naming a pool that has none."""
    out = {}
    for p in spec.pools:
        prof = next((x for x in profiles if x.target == p.target and x.pool == p.name),
                    next((x for x in profiles if x.target == p.target), None))
        if prof is None:
            raise SimInputError(f"no profile for pool {p.name} (target {p.target}); measure one with "
                                f"`tideserve bench profile FILE --pool {p.name}` and pass it with --profile")
        out[p.name] = prof
    return out


class Simulation:
    """One run; ``run()`` returns a ``RunResult``. Raises SimInputError when a pool has no profile."""

    def __init__(self, spec: EndpointSpec, requests: Sequence[TraceRequest], profiles: Sequence[PoolProfile],
                 options: RunOptions | None = None) -> None:
        self.spec = spec
        self.opt = options or RunOptions()
        self.requests = list(requests)
        self.rng = random.Random(self.opt.seed)
        # Service-time draws: a stream of their own, derived from the seed so that it is not seed
        # + 1's spot stream (runs over several seeds would then share draws).
        self._draw = random.Random(f"{self.opt.seed}:service")
        self.profiles = profiles_for(spec, profiles)
        self.pools = {p.name: p for p in spec.pools}
        self.now = 0.0
        self._events: list = []
        self._seq = 0
        self.replicas: dict[str, _Replica] = {}
        self.nodes: dict[str, _Node] = {}
        self.reqs: dict[int, _Req] = {}
        self.load = LoadTracker(lambda: self.now)
        self.held: HoldQueue[int] = HoldQueue(spec.gateway.max_pending, spec.gateway.hold_timeout_s)
        from tideserve.sim import baselines

        self.scaler = baselines.make(self.opt.autoscaler, spec, self.requests, self.opt.coldstart, self._expected_cold_start)
        self.state = self.scaler.initial_state
        self.busy_s: dict[str, float] = {}
        self.timeline: list[tuple[float, int, dict[str, int], int, int]] = []
        self.replica_starts = 0
        self.interruptions = 0
        self.replaced_nodes = 0  # nodes replaced by cheaper ones (consolidation by replacement)
        self.decisions = 0
        self._waiting_batch: tuple[float, float] | None = None  # (first pending, last pending)
        self._spot_blocked: dict[str, float] = {}
        self._n_replicas = 0
        self._n_nodes = 0
        self._done = 0
        self._fns = _policy()
        self._win: float | None = None
        self._prof_cap: dict[str, float] = {}
        self._wins: list[float] | None = None

    # -- what the gateway would know of a pool -----------------------------------------------
    def _mean_window_s(self) -> float:
        if self._win is None:
            lengths = [w for q in self.reqs.values() for w in q.windows]
            self._win = sum(lengths) / len(lengths) if lengths else WINDOW_S
        return self._win

    def capacity_audio_s(self, pool: str) -> float:
        """Audio seconds per second one replica serves at the best batch size it can reach
        (<= min(max_batch_size, max_concurrency)), from the profile and the trace's window
        lengths (``_batch_rate``). The live gateway passes its measured throughput instead
        (``LoadTracker.throughput_audio_s``)."""
        if pool not in self._prof_cap:
            p = self.pools[pool]
            top = max(1, min(self.spec.batching.max_batch_size, p.max_concurrency))
            self._prof_cap[pool] = max(self._batch_rate(pool, b) for b in range(1, top + 1))
        return self._prof_cap[pool]

    def _batch_rate(self, pool: str, b: int) -> float:
        """Audio seconds per second of batches of ``b`` windows drawn from the trace's window
        lengths: b x mean window / E[service time of the longest of b windows] (a batch takes
        as long as its longest window)."""
        xs = self._windows_sorted()
        n = len(xs)
        # 20 quantiles of the window lengths are enough for the expectation.
        k = min(n, 20)
        qs = [xs[min(n - 1, int((i + 0.5) * n / k))] for i in range(k)]
        prof = self.profiles[pool]
        expect = sum(prof.service_time_s(b, q) * (((i + 1) / k) ** b - (i / k) ** b) for i, q in enumerate(qs))
        return b * self._mean_window_s() / expect

    def _windows_sorted(self) -> list[float]:
        if self._wins is None:
            self._wins = sorted(w for q in self.reqs.values() for w in q.windows) or [WINDOW_S]
        return self._wins

    def _expected_cold_start(self, pool: str) -> float:
        """Wanted -> ready for a replica that needs a new machine (the catalog's phases), or the
        embedded start in local mode; what the core measures once a replica has started."""
        cs = self.opt.coldstart
        if self.opt.cluster == "local":
            return cs.embedded_replica_start_s
        acc = self._accel_key(pool)
        boots = [o.boot_s for o in self._offerings() if o.accelerator == acc]
        boot = min(boots) if boots else CPU_NODE_BOOT_S
        return (cs.batch_idle_s + cs.launch_delay_s + boot + cs.image_pull_s(self._is_gpu(pool))
                + cs.replica_start_s(self.spec.model.source))

    # -- event queue -------------------------------------------------------------------------
    def _at(self, t: float, kind: str, *args) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, kind, args))

    # -- machines ----------------------------------------------------------------------------
    def _is_gpu(self, pool: str) -> bool:
        return self.pools[pool].accelerator != "cpu"

    def _accel_key(self, pool: str) -> str:
        """The accelerator name the provisioner sees: the GPU model, or "cpu:<pool>" for a CPU
        pool's own node type in aws mode, "cpu" in local mode."""
        acc = self.pools[pool].accelerator
        if acc != "cpu":
            return acc
        return "cpu" if self.opt.cluster == "local" else f"cpu:{pool}"

    def _offerings(self) -> tuple[Offering, ...]:
        if self.opt.cluster == "local":
            return ()
        cpu = tuple(
            Offering(f"cpu-{p.name}", f"cpu:{p.name}", 1, 0.0, 0, 0.0, p.cost_usd_per_h, CPU_NODE_BOOT_S,
                     "the pool's cost_usd_per_h as the price of one CPU replica's node; boot from the provisioner catalog")
            for p in self.spec.pools if p.accelerator == "cpu")
        return tuple(self.opt.offerings) + cpu

    def _market(self) -> SpotMarket:
        blocked = frozenset(k for k, until in self._spot_blocked.items() if until > self.now)
        return SpotMarket(discount=self.opt.spot_discount, unavailable=blocked)

    def _new_node(self, offering: Offering, capacity_type: str, ready_at: float, launched_at: float) -> _Node:
        self._n_nodes += 1
        name = f"node-{self._n_nodes}"
        price = offering.price_usd_per_h(capacity_type, self.opt.spot_discount)
        rec = NodeRecord(name, offering.instance_type, offering.accelerator, offering.accelerator_count,
                         capacity_type, price, launched_at)
        node = _Node(rec, offering, ready_at)
        self.nodes[name] = node
        if capacity_type == "spot" and self.opt.spot_interruption_rate_per_h > 0:
            dt = self.rng.expovariate(self.opt.spot_interruption_rate_per_h / 3600.0)
            self._at(launched_at + dt, "spot_notice", name)
        return node

    def _live_nodes(self) -> list[_Node]:
        return [n for n in self.nodes.values() if n.rec.ended_s is None]

    def _node_views(self) -> list[Node]:
        return [Node(n.rec.name, n.offering, n.rec.capacity_type,
                     tuple(self.replicas[r].pool for r in n.replicas),
                     None if self.opt.cluster == "local" else n.rec.launched_s)
                for n in self._live_nodes() if not n.interrupted]

    def _end_node(self, node: _Node, reason: str) -> None:
        node.rec.ended_s = self.now
        node.rec.end_reason = reason

    # -- replicas ----------------------------------------------------------------------------
    def _new_replica(self, pool: str, state: RS) -> _Replica:
        self._n_replicas += 1
        rid = f"{pool}-{self._n_replicas}"
        r = _Replica(self.load.record(rid, pool, state))
        if state == RS.READY:
            r.rec.ready_at = self.now
        self.replicas[r.id] = r
        return r

    def _set(self, r: _Replica, state: RS) -> None:
        self.load.set_state(r.id, r.pool, state)
        r.rec.state = state

    def _start_on(self, r: _Replica, node: _Node) -> None:
        """Replica ``r`` got a place on ``node``: schedule its readiness."""
        r.node = node.rec.name
        self._set(r, RS.STARTING)
        node.replicas.append(r.id)
        node.empty_since = None
        self.replica_starts += 1
        cs = self.opt.coldstart
        if self.opt.cluster == "local":
            ready = self.now + cs.embedded_replica_start_s
        else:
            t = max(self.now, node.ready_at)
            if node.image_ready_at is None:
                node.image_ready_at = t + cs.image_pull_s(self._is_gpu(r.pool))
            ready = max(t, node.image_ready_at) + cs.replica_start_s(self.spec.model.source)
        self._at(ready, "replica_ready", r.id)

    def _remove_replica(self, r: _Replica) -> None:
        self._set(r, RS.STOPPED)
        if r.node is not None and r.node in self.nodes:
            node = self.nodes[r.node]
            if r.id in node.replicas:
                node.replicas.remove(r.id)
            if not node.replicas:
                node.empty_since = self.now

    def _maybe_finish_drain(self, r: _Replica) -> None:
        if r.state == RS.DRAINING and r.outstanding == 0 and not r.queue and not r.executing:
            self._remove_replica(r)

    def _provision(self) -> None:
        """Place replicas waiting for a machine (``plan_launches``)."""
        waiting = [r for r in self.replicas.values() if r.state == RS.WAITING]
        if not waiting:
            return
        counts: dict[str, int] = {}
        for r in waiting:
            counts[r.pool] = counts.get(r.pool, 0) + 1
        pending = [ReplicaRequest(pool, self._accel_key(pool), 1, tuple(self.pools[pool].capacity_types), k)
                   for pool, k in sorted(counts.items())]
        plan = self._fns["plan_launches"](pending, self._offerings(), self._market(), self._node_views())
        by_pool: dict[str, list[_Replica]] = {}
        for r in waiting:
            by_pool.setdefault(r.pool, []).append(r)
        for node_name, pools in plan.on_existing:
            for pool in pools:
                self._start_on(by_pool[pool].pop(0), self.nodes[node_name])
        cs = self.opt.coldstart
        for offering, capacity_type, pools in plan.launches:
            launched = self.now + cs.launch_delay_s
            node = self._new_node(offering, capacity_type, launched + offering.boot_s, launched)
            for pool in pools:
                self._start_on(by_pool[pool].pop(0), node)

    def _want_machines(self) -> None:
        """A replica waits for a machine: open or extend the Karpenter batch window."""
        if self.opt.cluster == "local":
            self._provision()
            return
        first, _ = self._waiting_batch or (self.now, self.now)
        self._waiting_batch = (first, self.now)
        cs = self.opt.coldstart
        self._at(min(self.now + cs.batch_idle_s, first + cs.batch_max_s), "karpenter")

    # -- gateway -----------------------------------------------------------------------------
    def _rates(self) -> dict[str, float]:
        return self.load.service_rates()

    def _try_dispatch(self, q: _Req) -> bool:
        rates = self._rates()
        views = [ReplicaView(r.id, r.state.serves, r.outstanding, self.pools[r.pool].max_concurrency,
                             r.rec.last_chosen, rates.get(r.pool, 1.0))
                 for r in self.replicas.values() if r.state == RS.STARTING or r.state.serves]
        rid = self._fns["choose_replica"](views)
        if rid is None:
            return False
        r = self.replicas[rid]
        self.load.dispatched(rid, r.pool, q.out.audio_s)
        r.requests.add(q.out.id)
        q.replica, q.dispatched_at, q.left = rid, self.now, len(q.windows)
        q.out.pool = r.pool
        for a in q.windows:
            r.queue.append((q.out.id, self.now, a))
        self._poke(r)
        return True

    def _admit(self, q: _Req) -> None:
        """Route ``q`` now (only when nothing is held: no overtaking), or hold it, or refuse it
        (max_pending)."""
        if not len(self.held) and self._try_dispatch(q):
            return
        if not self.held.may_hold():
            q.out.status = "rejected"
            self._done += 1
            self._answered(q)
            return
        q.out.held = True
        q.hold_token += 1
        deadline = self.held.push(q.out.id, self.now, q.out.audio_s)
        self._at(deadline, "hold_timeout", q.out.id, q.hold_token)
        if self.scaler.wake_on_hold:
            self._autoscale()  # activation: decide now, not at the next tick
        self._release_held()

    def _release_held(self) -> None:
        self.held.release(lambda rid: self._try_dispatch(self.reqs[rid]))

    # -- batcher -----------------------------------------------------------------------------
    def _instances(self, pool: str) -> int:
        """Model instances of one replica of ``pool`` (as ``worker.engine.EngineLoop``)."""
        if self.spec.model.backend == "torch":
            return 1
        return self.spec.batching.instances or default_instances(self.opt.cpu_cores)

    def _poke(self, r: _Replica) -> None:
        """Start batches on ``r``'s free instances (``next_batch``), or
        schedule the wake-up for when the oldest queued window's delay runs out."""
        if not r.queue or not (r.state.serves or r.state == RS.DRAINING):
            return
        batch_spec = self.spec.batching
        instances = self._instances(r.pool)
        started = False
        while r.queue and len(r.executions) < instances:
            items = [batching.QueuedItem(rid, t) for rid, t, _ in r.queue]
            busy = collections.Counter(i for e in r.executions for i in e.ids)
            cut = self._fns["next_batch"](items, busy, sum(e.background for e in r.executions),
                                          instances - len(r.executions), instances, batch_spec.max_batch_size,
                                          batch_spec.max_queue_delay_ms / 1000.0, self.now)
            if cut is None:
                break
            if not cut.take:
                r.wake_token += 1
                self._at(self.now + cut.wait_s, "batch_wake", r.id, r.wake_token)
                break
            take = list(cut.take)
            batch = [r.queue[k] for k in take]
            taken = set(take)
            r.queue = [x for k, x in enumerate(r.queue) if k not in taken]
            service = self._work_s(self.profiles[r.pool], len(batch), max(a for _, _, a in batch))
            acc = self.pools[r.pool].accelerator
            self.busy_s[acc] = self.busy_s.get(acc, 0.0) + service
            self._share_advance(r)
            r.executions.append(_Execution(tuple(rid for rid, _, _ in batch), service, self.now,
                                           max(a for _, _, a in batch), background=cut.background))
            started = True
        if started:
            self._share_reschedule(r)

    def _work_s(self, prof: PoolProfile, size: int, audio_s: float) -> float:
        """One execution's work, s: the profile's interpolated median times a draw from the
        nearest measured point's samples over its median (module docstring)."""
        median = prof.service_time_s(size, audio_s)
        point = min(prof.points, key=lambda p: (abs(p.audio_s - audio_s), abs(p.batch_size - size)))
        if not point.samples_s:
            return median
        return median * self._draw.choice(point.samples_s) / point.latency_s

    def _sharers(self, r: _Replica) -> list[_Replica]:
        """The replicas whose executions share what ``r``'s run on: for a CPU pool, every CPU
        replica on its machine; for a GPU pool, ``r`` alone (its own GPU)."""
        if self._is_gpu(r.pool) or r.node is None or r.node not in self.nodes:
            return [r]
        return [self.replicas[x] for x in self.nodes[r.node].replicas
                if x in self.replicas and not self._is_gpu(self.replicas[x].pool)]

    def _share_advance(self, r: _Replica) -> None:
        """Charge the work done since the last change to every execution sharing with ``r``."""
        for x in self._sharers(r):
            for e in x.executions:
                e.work_s = max(0.0, e.work_s - (self.now - e.since) * e.speed)
                e.since = self.now

    def _share_reschedule(self, r: _Replica) -> None:
        """Give every execution sharing with ``r`` its new speed and completion event."""
        sharers = self._sharers(r)
        running = [e for x in sharers for e in x.executions]
        if not running:
            return
        if self._is_gpu(r.pool):
            speeds = iter([1.0 / len(running)] * len(running))
        else:  # each execution keeps the cores its own pool's profile says busy
            cores = self.opt.cpu_cores
            threads = intra_op_threads(cores)
            nice = self.spec.batching.background_nice
            demand = [(min(threads, (self.profiles[x.pool].busy_cores_per_window or threads) * e.size),
                       nice_weight(nice if e.background else 0)) for x in sharers for e in x.executions]
            speeds = iter(weighted_speeds(demand, cores))
        for x in sharers:
            for e in x.executions:
                speed = next(speeds)
                e.speed, e.since = speed, self.now
                e.token += 1
                self._at(self.now + e.work_s / speed, "batch_done", x.id, e, e.token)

    # -- autoscaler --------------------------------------------------------------------------
    def _snapshot(self) -> Snapshot:
        rates = self._rates()
        cold = self.load.cold_start_s()
        win = self._mean_window_s()
        pools = []
        for p in self.spec.pools:
            reps = tuple(ReplicaSnapshot(r.id, "ready" if r.state == RS.READY else "starting", r.outstanding,
                                         r.rec.outstanding_audio_s, r.rec.wanted_at)
                         for r in self.replicas.values() if r.pool == p.name and r.state.counts_as_capacity)
            pools.append(PoolSnapshot(p.name, p.replicas.min, p.replicas.max, p.cost_usd_per_h, rates.get(p.name), True,
                                      reps, self.capacity_audio_s(p.name), cold.get(p.name),
                                      self.profiles[p.name].service_time_s(1, win)))
        slots = self.opt.replica_slots if self.opt.cluster == "local" else None
        rate, rate_at = self.load.arrival_rate_audio_s()
        return Snapshot(len(self.held), self.load.in_flight(), self.load.last_arrival(), tuple(pools), slots,
                        self.held.audio_s(), rate, self.load.iat_histogram(), rate_at,
                        self.load.answer_history())

    def _autoscale(self) -> None:
        if self.opt.static is not None:
            return
        decide = self._fns["decide"] if self.scaler.decide is None else self.scaler.decide
        decision, self.state = decide(self._snapshot(), self.spec.autoscaling, self.state, self.now)
        self.decisions += 1
        self._apply(decision.desired, decision.drain)

    def _apply(self, desired: Mapping[str, int], drain: Sequence[str]) -> None:
        """As the local runtime applies a decision (``core.plan_apply``): replicas named that do
        not serve yet stop, ready ones drain; then replicas are added until each pool has
        ``desired`` (those without a machine wait for the provisioner)."""
        plan = plan_apply(((r.id, r.pool, r.state) for r in self.replicas.values()), desired, drain)
        for rid in plan.stop:
            self._remove_replica(self.replicas[rid])  # no work yet
        for rid in plan.drain:
            r = self.replicas[rid]
            self._set(r, RS.DRAINING)
            self._maybe_finish_drain(r)
        for pool, n in plan.add.items():
            for _ in range(n):
                self._new_replica(pool, RS.WAITING)
        # A leaving replica waits for a replacement only while one is coming; when the decision
        # starts none (the other replicas suffice, or the pool scales to zero) it drains now.
        coming = {r.pool for r in self.replicas.values() if r.state.not_ready_yet}
        for r in [r for r in self.replicas.values() if r.state == RS.LEAVING and r.pool not in coming]:
            self._drain(r)
        if plan.add:
            self._want_machines()

    def _consolidate(self) -> None:
        if self.opt.cluster == "local":
            return
        names = self._fns["consolidate"](self._node_views(), self._market(), self.now)
        cs = self.opt.coldstart
        for name in names:
            node = self.nodes[name]
            if not node.replicas and node.empty_since is not None and self.now - node.empty_since >= cs.consolidate_after_s:
                self._end_node(node, "consolidated")
        # Replacement (make before break): the replicas of a node a cheaper one would replace
        # become LEAVING; the autoscaler asks for their replacements, and each drains once one
        # is ready (_on_replica_ready). Only nodes whose replicas all serve and take requests.
        steady = [v for v in self._node_views()
                  if all(self.replicas[r].state == RS.READY for r in self.nodes[v.name].replicas)]
        shapes = {p: ReplicaRequest(p, self._accel_key(p), 1, tuple(self.pools[p].capacity_types)) for p in self.pools}
        replaced = self._fns["replacements"](steady, shapes, self._offerings(), self._market(), self.now,
                                             cs.consolidate_after_s)
        for name in replaced:
            for rid in self.nodes[name].replicas:
                self._set(self.replicas[rid], RS.LEAVING)
            self.replaced_nodes += 1
        if replaced:
            self._autoscale()

    # -- the run -----------------------------------------------------------------------------
    def _initial(self) -> None:
        """Replicas running at t = 0 (``warm``), ready, on machines that are already up: the local
        machine, or machines chosen by ``plan_launches`` (cheapest per replica): on-demand for a
        static fleet, the pool's own capacity types otherwise (so that keeping a replica warm
        is not confounded with giving up spot)."""
        warm = self.opt.warm if self.opt.warm is not None else (
            self.opt.static if self.opt.static is not None else {p.name: p.replicas.min for p in self.spec.pools})
        if self.opt.cluster == "local":
            self._new_node(prov_catalog.local_node(self.opt.replica_slots, self.opt.local_cost_usd_per_h),
                           "on-demand", 0.0, 0.0)
        reps = {pool: [self._new_replica(pool, RS.READY) for _ in range(k)] for pool, k in sorted(warm.items()) if k > 0}
        if reps and self.opt.static is None:
            # Warm replicas stand for a service that was running before the replay starts: it
            # was not idle at t = 0 (else the first decision scaled the warm replicas to zero).
            self.load.mark_active()
        if self.opt.cluster == "local":
            node = next(iter(self.nodes.values()))
            for r in (r for rs in reps.values() for r in rs):
                r.node = node.rec.name
                node.replicas.append(r.id)
        elif reps:
            plan = self._fns["plan_launches"](
                [ReplicaRequest(pool, self._accel_key(pool), 1,
                                ("on-demand",) if self.opt.static is not None else tuple(self.spec.pool(pool).capacity_types),
                                len(rs)) for pool, rs in reps.items()],
                self._offerings(), self._market())
            if plan.unplaceable:
                pool, k, why = plan.unplaceable[0]
                raise SimInputError(f"cannot place {k} warm replica(s) of pool {pool}: {why}")
            for offering, capacity_type, pools in plan.launches:
                node = self._new_node(offering, capacity_type, 0.0, 0.0)
                for pool in pools:
                    r = reps[pool].pop(0)
                    r.node = node.rec.name
                    node.replicas.append(r.id)
        if self.opt.static is not None:
            self._apply(dict(self.opt.static), ())

    def _sample(self) -> None:
        ready: dict[str, int] = {p: 0 for p in self.pools}
        total = 0
        for r in self.replicas.values():
            if r.state == RS.READY:
                ready[r.pool] += 1
            if r.state != RS.STOPPED:
                total += 1
        load = len(self.held) + sum(r.outstanding for r in self.replicas.values())
        self.timeline.append((self.now, load, ready, total, len(self._live_nodes())))

    def run(self) -> RunResult:
        for t in self.requests:
            windows = [WINDOW_S] * int(t.audio_s // WINDOW_S)
            rest = t.audio_s - WINDOW_S * len(windows)
            if rest > 1e-9 or not windows:
                windows.append(rest if rest > 1e-9 else t.audio_s)
            self.reqs[t.id] = _Req(RequestOutcome(t.id, t.arrival_s, t.audio_s), windows)
            self._at(t.arrival_s, "arrival", t.id)
        for pool in self.pools:
            self.load.observe_cold_start(pool, self._expected_cold_start(pool))
        self._initial()
        interval = self.scaler.interval_s or self.spec.autoscaling.interval_s
        self._at(0.0, "tick")
        total = len(self.requests)
        while self._events and self._done < total:
            self.now, _, kind, args = heapq.heappop(self._events)
            getattr(self, f"_on_{kind}")(*args)
            if kind == "tick":
                self._at(self.now + interval, "tick")
        end = self.now
        for n in self._live_nodes():
            self._end_node(n, "end")
        self._sample()
        return RunResult([q.out for q in self.reqs.values()], [n.rec for n in self.nodes.values()], self.timeline,
                         self.busy_s, self.replica_starts, self.interruptions, end, self.decisions)

    # -- event handlers ----------------------------------------------------------------------
    def _on_tick(self) -> None:
        self._sample()
        self._autoscale()
        self._consolidate()
        if any(r.state == RS.WAITING for r in self.replicas.values()) and self._waiting_batch is None:
            self._want_machines()  # retry replicas no offering could take last time

    def _answered(self, q: _Req) -> None:
        """``q`` was answered (its latency), refused or timed out (None): the SLO term's count,
        as the gateway's ``account`` makes it."""
        self.load.answered(q.out.latency_s, self.spec.autoscaling.slo_p95_s, q.out.audio_s, q.ready_at_arrival)

    def _on_arrival(self, rid: int) -> None:
        self.load.arrived(self.reqs[rid].out.audio_s)
        self.reqs[rid].ready_at_arrival = self.load.ready_count()
        self._admit(self.reqs[rid])

    def _on_hold_timeout(self, rid: int, token: int) -> None:
        q = self.reqs[rid]
        if q.out.status == "pending" and q.replica is None and q.hold_token == token and self.held.remove(rid):
            q.out.status = "timeout"
            self._done += 1
            self._answered(q)

    def _on_karpenter(self) -> None:
        if self._waiting_batch is None:
            return
        first, last = self._waiting_batch
        cs = self.opt.coldstart
        if self.now + 1e-9 < min(last + cs.batch_idle_s, first + cs.batch_max_s):
            return  # the window was extended; a later event closes it
        self._waiting_batch = None
        self._provision()

    def _on_replica_ready(self, rid: str) -> None:
        r = self.replicas[rid]
        if r.state != RS.STARTING:
            return
        self._set(r, RS.READY)
        # Make before break: the oldest replica of this pool under a spot notice drains now.
        leaving = [x for x in self.replicas.values() if x.pool == r.pool and x.state == RS.LEAVING]
        if leaving:
            self._drain(min(leaving, key=lambda x: x.rec.wanted_at))
        self._release_held()

    def _drain(self, r: _Replica) -> None:
        self._set(r, RS.DRAINING)
        self._maybe_finish_drain(r)

    def _on_spot_drain(self, rid: str) -> None:
        r = self.replicas[rid]
        if r.state == RS.LEAVING:  # no replacement ready in time: stop taking requests
            self._drain(r)

    def _on_batch_wake(self, rid: str, token: int) -> None:
        r = self.replicas[rid]
        if token == r.wake_token:
            self._poke(r)

    def _on_batch_done(self, rid: str, execution: _Execution, token: int) -> None:
        r = self.replicas[rid]
        if token != execution.token or execution not in r.executions:
            return  # its speed changed since (a newer event stands), or its machine was lost
        self._share_advance(r)
        r.executions.remove(execution)
        self._share_reschedule(r)
        for qid in execution.ids:
            q = self.reqs[qid]
            if q.replica != rid or q.out.status != "pending":
                continue  # retried elsewhere after a spot termination
            q.left -= 1
            if q.left == 0:
                q.out.status = "ok"
                q.out.latency_s = self.now - q.out.arrival_s
                self._done += 1
                r.requests.discard(qid)
                self.load.finished(rid, q.out.audio_s, self.now - q.dispatched_at)
                self._answered(q)
        if r.state == RS.STOPPED:
            return
        self._maybe_finish_drain(r)
        self._poke(r)
        self._release_held()

    def _on_spot_notice(self, name: str) -> None:
        node = self.nodes[name]
        if node.rec.ended_s is not None:
            return
        self.interruptions += 1
        node.interrupted = True
        self._spot_blocked[node.offering.instance_type] = self.now + self.opt.coldstart.spot_unavailable_after_interruption_s
        cs = self.opt.coldstart
        for rid in list(node.replicas):
            r = self.replicas[rid]
            if r.state in (RS.WAITING, RS.STARTING):
                self._remove_replica(r)
            elif r.state == RS.READY:
                # Make before break: it serves on while its replacement starts (core.ReplicaState).
                self._set(r, RS.LEAVING)
                self._at(self.now + max(0.0, cs.spot_notice_s - cs.spot_drain_margin_s), "spot_drain", r.id)
        self._at(self.now + cs.spot_notice_s, "spot_terminate", name)
        if self.scaler.wake_on_hold:
            self._autoscale()  # replacement: the autoscaler does not count leaving replicas

    def _on_spot_terminate(self, name: str) -> None:
        node = self.nodes[name]
        if node.rec.ended_s is not None:
            return
        for rid in list(node.replicas):
            r = self.replicas[rid]
            lost = sorted(r.requests)
            for qid in lost:
                self.load.finished(rid, self.reqs[qid].out.audio_s, served=False)
            r.queue, r.requests, r.executions = [], set(), []
            self._remove_replica(r)
            for qid in lost:
                q = self.reqs[qid]
                q.replica = None
                q.out.retries += 1
                self._admit(q)
        self._end_node(node, "interrupted")


def simulate(spec: EndpointSpec, requests: Sequence[TraceRequest], profiles: Sequence[PoolProfile],
             options: RunOptions | None = None) -> RunResult:
    """Replay ``requests`` against ``spec`` (see the module docstring); deterministic for a seed."""
    return Simulation(spec, requests, profiles, options).run()


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile: the smallest value with at least p% of ``values`` at or below it
    (None for no values)."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, math.ceil(p / 100.0 * len(s)) - 1)]
