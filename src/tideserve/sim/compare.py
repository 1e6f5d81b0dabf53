"""Policies compared on one trace in one run, and the saving of each tideserve lever.

Policies (each a ``simulate`` run of the same requests):

- ``static-peak``: a fixed fleet sized for the busiest ``window_s`` (60 s) of the trace, then grown
  one replica at a time until its replay meets the SLO for ``autoscaling.slo_attainment`` of the
  requests (a fleet for the peak that misses the SLO at it is not one anybody would run: on the
  synthetic day, bursts within a minute made the rate-sized 1 x A10G meet 97.8%);
- ``static-mean``: a fixed fleet sized for the trace's mean arrival rate;
- ``tideserve``: the endpoint as written: the autoscaler (scale to zero where a pool's min is 0,
  cheapest pool per unit of service first), spot where a pool lists it with on-demand fallback,
  spot interruptions at the given rate, replacement through the provisioner;
- ``keda-hpa``, ``knative``, ``oracle``: the same endpoint (pools, capacity types, spot) with
  the autoscaler replaced by a baseline of ``tideserve.sim.baselines`` (published defaults; the
  oracle knows the arrivals and cold starts in advance: see there how it is computed);
- ``oracle (no spot)``, where a pool lists spot: the oracle on on-demand machines only, the
  yardstick for ``no spot`` (the on-demand-only lever); the oracle is a clairvoyant heuristic,
  not an optimum, so it bounds nothing (on the CPU code trace it costs more than a static fleet).

Static fleets run on on-demand machines and never scale; their size N is the smallest for which
the autoscaler's own placement ``place(N, pools)`` (cheapest per unit of service rate first, pool
maxima lifted) serves the arrival rate at ``static_utilization`` (0.7) of its capacity. A replica's
capacity is its best throughput from the profile: max over batch sizes B <= min(max_batch_size,
max_concurrency) of B / service_time(B, mean window length).

Levers: each is switched off in a run otherwise identical to ``tideserve``; its saving is
cost(lever off) - cost(tideserve):

- scale-to-zero off: the pool that ``place(1, ...)`` picks first keeps at least one replica;
- heterogeneous pools off: only the fastest pool (lowest batch-1 latency at the mean window
  length), its max raised to the sum of all pools' maxima;
- spot off: every pool on-demand only;
- batching off: ``max_batch_size`` 1.

A lever that is already off in the endpoint (e.g. no pool lists spot) is reported as not
applicable, not run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from collections.abc import Mapping, Sequence

from tideserve.autoscaler import policy as autoscaler_policy
from tideserve.autoscaler.policy import PoolSnapshot
from tideserve.sim.engine import WINDOW_S, RunOptions, RunResult, Simulation, percentile, profiles_for, simulate
from tideserve.sim.profile import PoolProfile
from tideserve.sim.trace import TraceRequest
from tideserve.spec.models import EndpointSpec


#: Baseline runs (``tideserve.sim.baselines``) and what the report says of each.
BASELINES = (
    ("keda-hpa", "KEDA + HPA defaults on requests per replica (target = autoscaling.target): 30 s polling, 15 s "
                 "sync, tolerance 0.1, 300 s scale-down window, 300 s cooldown to zero"),
    ("knative", "Knative KPA defaults on concurrency (target = autoscaling.target): 60 s stable / 6 s panic "
                "window at 200%, scale down at most /2 per 2 s tick, 30 s grace to zero"),
    ("oracle", "clairvoyant: knows arrivals and cold starts; each replica started one cold start before the "
               "audio it serves within the SLO arrives, kept through gaps shorter than a cold start"),
)


@dataclass(frozen=True)
class Summary:
    """One run in figures. Costs $, hours h, latencies s; ``slo_attainment`` is the share of ALL
    requests answered within the SLO (refused and timed-out requests count as misses).

    Over several seeds (``summarize`` of several results) every figure is the mean over the seeds
    (counts too, so they may be fractional), ``slo_attainment`` and the percentiles are over all
    seeds' requests pooled, and ``cost_min_usd`` / ``cost_max_usd`` give the spread of the cost."""

    cost_usd: float
    gpu_hours: float
    cpu_node_hours: float
    idle_gpu_hours: float
    idle_cpu_node_hours: float
    slo_attainment: float
    p50_s: float | None
    p95_s: float | None
    p99_s: float | None
    ok: float
    failed: float
    held: float
    cold_starts: float
    spot_interruptions: float
    retries: float
    duration_s: float
    seeds: int = 1
    cost_min_usd: float | None = None
    cost_max_usd: float | None = None


@dataclass
class PolicyRun:
    """A policy's run: ``result`` is the first seed's (the plots show it), ``results`` every
    seed's (``options.seed``, ``options.seed`` + 1, ...), ``summary`` their figures together."""

    name: str
    description: str
    spec: EndpointSpec
    options: RunOptions
    result: RunResult
    summary: Summary
    results: Sequence[RunResult] = ()


@dataclass(frozen=True)
class Lever:
    """A lever's saving: ``off`` is the run with the lever switched off (None: not applicable,
    ``note`` says why)."""

    name: str
    off: PolicyRun | None
    saving_usd: float | None
    note: str = ""


def _node_hours(result: RunResult) -> tuple[float, float, float]:
    """(cost $, GPU-hours, CPU node-hours) of one run; node time is clamped to the run's end."""
    cost = gpu_h = cpu_h = 0.0
    for n in result.nodes:
        hours = max(0.0, (n.ended_s if n.ended_s is not None else result.end_s) - n.launched_s) / 3600.0
        cost += n.price_usd_per_h * hours
        if n.accelerator.startswith("cpu"):
            cpu_h += hours * n.accelerators
        else:
            gpu_h += hours * n.accelerators
    return cost, gpu_h, cpu_h


def summarize(result: RunResult | Sequence[RunResult], slo_s: float) -> Summary:
    """Figures of one run, or of the same run over several seeds (definitions in ``Summary``).
    Raises ValueError for an empty sequence."""
    results = [result] if isinstance(result, RunResult) else list(result)
    if not results:
        raise ValueError("summarize needs at least one run result")
    k = len(results)

    def mean(values) -> float:
        return sum(values) / k

    def per_seed(total: int) -> float:  # a count: itself for one seed, else its mean
        return total if k == 1 else total / k

    hours = [_node_hours(r) for r in results]
    costs = [h[0] for h in hours]
    gpu_h, cpu_h = mean(h[1] for h in hours), mean(h[2] for h in hours)
    busy_gpu = mean(sum(v for a, v in r.busy_s.items() if a != "cpu") for r in results) / 3600.0
    busy_cpu = mean(r.busy_s.get("cpu", 0.0) for r in results) / 3600.0
    lat = [q.latency_s for r in results for q in r.requests if q.status == "ok" and q.latency_s is not None]
    n_requests = sum(len(r.requests) for r in results)
    return Summary(
        cost_usd=mean(costs), gpu_hours=gpu_h, cpu_node_hours=cpu_h, idle_gpu_hours=max(0.0, gpu_h - busy_gpu),
        idle_cpu_node_hours=max(0.0, cpu_h - busy_cpu),
        slo_attainment=sum(1 for x in lat if x <= slo_s) / n_requests if n_requests else 0.0,
        p50_s=percentile(lat, 50), p95_s=percentile(lat, 95), p99_s=percentile(lat, 99),
        ok=per_seed(len(lat)), failed=per_seed(n_requests - len(lat)),
        held=per_seed(sum(1 for r in results for q in r.requests if q.held)),
        cold_starts=per_seed(sum(r.replica_starts for r in results)),
        spot_interruptions=per_seed(sum(r.spot_interruptions for r in results)),
        retries=per_seed(sum(q.retries for r in results for q in r.requests)), duration_s=mean(r.end_s for r in results),
        seeds=k, cost_min_usd=min(costs), cost_max_usd=max(costs),
    )


def mean_window_s(requests: Sequence[TraceRequest]) -> float:
    """Mean length of a request's windows (audio cut into <= 30 s windows), s."""
    lengths = []
    for r in requests:
        full = int(r.audio_s // WINDOW_S)
        lengths += [WINDOW_S] * full
        if r.audio_s - full * WINDOW_S > 1e-9:
            lengths.append(r.audio_s - full * WINDOW_S)
    return sum(lengths) / len(lengths)


def replica_rate(spec: EndpointSpec, pool: str, profile: PoolProfile, window_s: float) -> float:
    """A replica's best throughput, windows per s: max over B of B / service_time(B, window_s)."""
    p = spec.pool(pool)
    top = max(1, min(spec.batching.max_batch_size, p.max_concurrency))
    return max(b / profile.service_time_s(b, window_s) for b in range(1, top + 1))


def arrival_rates(requests: Sequence[TraceRequest], window_s: float = 60.0) -> tuple[float, float]:
    """(peak, mean) arrivals per s: the busiest fixed ``window_s`` bin, and all requests over the
    trace's span (at least ``window_s``)."""
    bins: dict[int, int] = {}
    for r in requests:
        k = int(r.arrival_s // window_s)
        bins[k] = bins.get(k, 0) + 1
    span = max(window_s, max(r.arrival_s for r in requests) - min(r.arrival_s for r in requests))
    return max(bins.values()) / window_s, len(requests) / span


def static_fleet(spec: EndpointSpec, profiles: Sequence[PoolProfile], rate_per_s: float, window_s: float,
                 utilization: float = 0.7, rank: Mapping[str, float] | None = None,
                 at_least: int = 1) -> dict[str, int]:
    """The smallest fixed fleet of at least ``at_least`` replicas, placed by the autoscaler's
    ``place``, whose capacity times ``utilization`` covers ``rate_per_s`` requests/s (one window
    each on average; see module). ``rank``: pool -> the rate ``place`` ranks the pools by
    (cheapest per unit first; default the windows/s rates)."""
    by_pool = profiles_for(spec, profiles)
    rates = {p.name: replica_rate(spec, p.name, by_pool[p.name], window_s) for p in spec.pools}
    order = rank or rates
    pools = tuple(PoolSnapshot(p.name, 0, 1000, p.cost_usd_per_h, order[p.name]) for p in spec.pools)
    for n in range(max(1, at_least), 1001 * len(pools)):
        desired = autoscaler_policy.place(n, pools)
        if sum(k * rates[p] for p, k in desired.items()) * utilization >= rate_per_s:
            return {p: k for p, k in desired.items() if k}
    raise ValueError(f"no static fleet of up to 1000 replicas per pool serves {rate_per_s:.2f} requests/s")


#: Replicas a static-peak fleet may grow by to meet the SLO (each step is one more replay).
STATIC_GROWTH_MAX = 6


def _with_pools(spec: EndpointSpec, pools: list) -> EndpointSpec:
    return spec.model_copy(update={"pools": pools})


def compare(spec: EndpointSpec, requests: Sequence[TraceRequest], profiles: Sequence[PoolProfile],
            options: RunOptions, slo_s: float, utilization: float = 0.7,
            window_s: float = 60.0, start_warm: bool = False, seeds: int = 1) -> tuple[list[PolicyRun], list[Lever]]:
    """Run the policies and the lever-off variants (module docstring) on the same requests.

    ``seeds``: runs of each policy, with seeds ``options.seed`` .. ``options.seed + seeds - 1``
    (the simulator's random draws: service times from the profile's samples, spot interruptions),
    summarised together (``summarize``). One seed is one draw of the interruptions: on the synthetic
    day, a single interruption of the one A10G kept all day moved the day's cost by up to 17%
    (seeds 1-3: $12.03 / $10.28 / $11.66) as its replacement landed on a g5.2xlarge while g5.xlarge
    spot was unavailable and stayed there; the baselines, which start replicas all day, were hit
    less. Raises ValueError for ``seeds`` < 1.

    ``start_warm``: every autoscaled run starts with one ready replica (on the pool ``place``
    fills first) besides the pools' minimum, as a replay cut out of continuous traffic would
    find it; static fleets always start ready. Pools are ranked everywhere here (warm replica,
    static fleets, the scale-to-zero lever) as the work policy ranks them: by a replica's audio
    seconds per second on the trace's windows (``Simulation.capacity_audio_s``). Ranked by windows
    per second at the mean window instead, the large-v3 scenarios' static fleets and warm replicas
    sat on the L40S pool while the policy preferred the A10G one: the static fleets cost 1.85x what
    the same fleet on A10G costs, and each autoscaled run first paid for moving its replica."""
    if seeds < 1:
        raise ValueError(f"seeds {seeds} must be >= 1")
    win = mean_window_s(requests)
    sim = Simulation(spec, requests, profiles, options)
    capacity = {p.name: sim.capacity_audio_s(p.name) for p in spec.pools}  # the work policy's ranking
    if start_warm and options.warm is None:
        snaps0 = tuple(PoolSnapshot(p.name, p.replicas.min, p.replicas.max, p.cost_usd_per_h, capacity[p.name])
                       for p in spec.pools)
        options = dataclasses.replace(options, warm={k: v for k, v in autoscaler_policy.place(
            max(1, sum(p.replicas.min for p in spec.pools)), snaps0).items() if v})
    peak, mean = arrival_rates(requests, window_s)
    od = [p.model_copy(update={"capacity_types": ["on-demand"]}) for p in spec.pools]
    static_spec = _with_pools(spec, od)

    def run(name: str, desc: str, s: EndpointSpec, opt: RunOptions) -> PolicyRun:
        results = [simulate(s, requests, profiles, dataclasses.replace(opt, seed=opt.seed + k)) for k in range(seeds)]
        return PolicyRun(name, desc, s, opt, results[0], summarize(results, slo_s), results)

    def fleet_txt(fleet: Mapping[str, int]) -> str:
        return ", ".join(f"{k} x {p}" for p, k in fleet.items())

    runs = []
    target = spec.autoscaling.slo_attainment
    for name, rate, what in (("static-peak", peak, f"peak {peak * 60:.0f} req/min"),
                             ("static-mean", mean, f"mean {mean * 60:.1f} req/min")):
        fleet = static_fleet(spec, profiles, rate, win, utilization, rank=capacity)
        desc = f"fixed on-demand fleet for the {what}: {fleet_txt(fleet)}"
        r = run(name, desc, static_spec, dataclasses.replace(options, static=fleet, warm=None))
        # A fleet for the peak must also meet the SLO at it: grown one replica at a time (in
        # ``place`` order) until the replay does, as whoever sizes a static fleet would.
        first_fleet, first_slo, grown = fleet, r.summary.slo_attainment, 0
        while name == "static-peak" and r.summary.slo_attainment < target and grown < STATIC_GROWTH_MAX:
            grown += 1
            fleet = static_fleet(spec, profiles, rate, win, utilization, rank=capacity,
                                 at_least=sum(fleet.values()) + 1)
            desc = (f"fixed on-demand fleet for the {what} that meets the SLO for {100 * target:g}% of requests: "
                    f"{fleet_txt(fleet)} (sized for the rate alone, {fleet_txt(first_fleet)} met "
                    f"{100 * first_slo:.1f}%)")
            r = run(name, desc, static_spec, dataclasses.replace(options, static=fleet, warm=None))
        runs.append(r)
    base = run("tideserve", f"autoscaling as the endpoint file says (metric {spec.autoscaling.metric}, scale to "
               "zero, cheapest pool first, spot with on-demand fallback where listed)", spec,
               dataclasses.replace(options, static=None))
    runs.append(base)
    for name, desc in BASELINES:
        runs.append(run(name, desc, spec, dataclasses.replace(options, static=None, autoscaler=name)))
    if any("spot" in p.capacity_types for p in spec.pools):
        # The yardstick of the on-demand-only goal: what the clairvoyant oracle pays without spot.
        runs.append(run("oracle (no spot)", "the oracle with every pool on-demand only: what knowing the arrivals in "
                        "advance buys without spot", static_spec,
                        dataclasses.replace(options, static=None, autoscaler="oracle")))

    by_pool = profiles_for(spec, profiles)
    levers: list[Lever] = []

    def lever(name: str, s: EndpointSpec | None, note: str) -> None:
        if s is None:
            levers.append(Lever(name, None, None, note))
            return
        opt = dataclasses.replace(options, static=None)
        names = {p.name for p in s.pools}
        if opt.warm is not None and not set(opt.warm) <= names:  # the warm replicas go to the pools left
            opt = dataclasses.replace(opt, warm={s.pools[0].name: sum(opt.warm.values())})
        off = run(f"no {name}", note, s, opt)
        levers.append(Lever(name, off, off.summary.cost_usd - base.summary.cost_usd, note))

    # Scale to zero off: the pool the autoscaler fills first keeps one replica.
    snaps = tuple(PoolSnapshot(p.name, 0, p.replicas.max, p.cost_usd_per_h, capacity[p.name]) for p in spec.pools)
    first = next(p for p, k in autoscaler_policy.place(1, snaps).items() if k)
    if any(p.replicas.min >= 1 for p in spec.pools):
        lever("scale-to-zero", None, "not applicable: a pool keeps min >= 1 replicas in the endpoint file")
    else:
        pools = [p.model_copy(update={"replicas": p.replicas.model_copy(update={"min": 1})}) if p.name == first else p
                 for p in spec.pools]
        lever("scale-to-zero", _with_pools(spec, pools), f"pool {first} keeps 1 replica at all times")
    if len(spec.pools) < 2:
        lever("heterogeneous pools", None, "not applicable: the endpoint has one pool")
    else:
        fastest = min(spec.pools, key=lambda p: (by_pool[p.name].service_time_s(1, win), p.name))
        total = min(1000, sum(p.replicas.max for p in spec.pools))
        only = fastest.model_copy(update={"replicas": fastest.replicas.model_copy(update={"max": total})})
        lever("heterogeneous pools", _with_pools(spec, [only]),
              f"only the fastest pool, {fastest.name}, up to {total} replicas")
    if not any("spot" in p.capacity_types for p in spec.pools):
        lever("spot", None, "not applicable: no pool lists spot in capacity_types")
    else:
        lever("spot", static_spec, "every pool on-demand only")
    if spec.batching.max_batch_size == 1:
        lever("batching", None, "not applicable: max_batch_size is already 1")
    else:
        lever("batching", spec.model_copy(update={"batching": spec.batching.model_copy(update={"max_batch_size": 1})}),
              "max_batch_size 1")
    return runs, levers
