"""Each baseline's published behaviour on scripted load, the oracle's plan, and the live
dispatcher and the simulator agreeing on a short scripted trace."""

from __future__ import annotations

import asyncio

from sim_fixtures import fixed_profile, make_spec
from tideserve.autoscaler.policy import PoolSnapshot, ReplicaSnapshot, Snapshot
from tideserve.gateway.dispatch import Dispatcher
from tideserve.replicas import ReplicaEndpoint
from tideserve.sim import RunOptions, TraceRequest, simulate
from tideserve.sim.engine import Simulation
from tideserve.sim.baselines import KedaHpaState, KpaState, keda_hpa_decide, knative_decide, oracle_plan
from tideserve.spec.models import Autoscaling
from settle import settle

SPEC = Autoscaling(target=4)


def snap(n_ready: int, load: int, pending: int = 0) -> Snapshot:
    reps = tuple(ReplicaSnapshot(f"r{i}", "ready", 0) for i in range(n_ready))
    return Snapshot(pending, load - pending, 0.0, (PoolSnapshot("p", 0, 100, 1.0, None, True, reps),))


def test_keda_hpa_polls_every_30s_tolerates_10pct_limits_scale_up_and_cools_down_300s():
    st = KedaHpaState()
    d, st = keda_hpa_decide(snap(0, 3, pending=3), SPEC, st, 0.0)
    assert d.total == 1 and "activation" in d.reason  # 0 -> 1 at a poll, metric 3 > 0
    d, st = keda_hpa_decide(snap(1, 40), SPEC, st, 15.0)
    assert d.total == 1  # the HPA still sees the metric polled at t = 0 (3 requests): ratio 0.75 ... held by min 1
    d, st = keda_hpa_decide(snap(1, 40), SPEC, st, 30.0)
    assert d.total == 5 and "+4 pods" in d.reason  # polled 40 -> 10 wanted, +100% / +4 per 15 s: 5
    d, st = keda_hpa_decide(snap(5, 21), SPEC, st, 60.0)
    assert d.total == 5 and "tolerance" in d.reason  # 21 / 20 = 1.05 within 0.1
    d, st = keda_hpa_decide(snap(5, 4), SPEC, st, 90.0)
    assert d.total == 5 and "stabilization" in d.reason  # down only after 300 s
    d, st = keda_hpa_decide(snap(5, 0), SPEC, st, 120.0)
    assert d.total == 5
    d, st = keda_hpa_decide(snap(5, 0), SPEC, st, 385.0)
    assert d.total == 1 and "cooldownPeriod" in d.reason  # the 5s left the window; KEDA keeps 1 until the cooldown
    d, st = keda_hpa_decide(snap(1, 0), SPEC, st, 391.0)
    assert d.total == 0 and "scale to zero" in d.reason  # 300 s after the last active poll (t = 90)


def test_knative_panics_at_200_percent_and_scales_to_zero_after_the_grace_period():
    st = KpaState()
    t = 0.0
    for _ in range(5):  # 10 s of 4 concurrent requests on 1 replica: stable
        d, st = knative_decide(snap(1, 4), SPEC, st, t)
        t += 2
    assert d.total == 1 and "stable" in d.reason
    d, st = knative_decide(snap(1, 40), SPEC, st, t)  # burst: panic window average >= 2 x ready
    assert "panic" in d.reason and d.total >= 2
    panic_total = d.total
    t += 2
    d, st = knative_decide(snap(panic_total, 0), SPEC, st, t)
    assert d.total == panic_total  # never down in panic
    for _ in range(60):  # 120 s of nothing: panic ends after 60 s, halving at most per tick, then grace
        t += 2
        d, st = knative_decide(snap(max(d.total, 1), 0), SPEC, st, t)
    assert d.total == 0 and "grace" in d.reason
    d, st = knative_decide(snap(0, 1, pending=1), SPEC, st, t + 2)
    assert d.total == 1 and "activator" in d.reason  # from zero at once


def test_oracle_plan_starts_replicas_one_cold_start_ahead_and_bridges_short_gaps():
    # 10 audio-s arriving at t = 100 and at t = 130; capacity 1 audio-s/s, budget 10 s -> 1 replica.
    plan = oracle_plan([(100.0, 10.0), (130.0, 10.0)], capacity=1.0, budget_s=10.0, lookahead_s=50.0, horizon_s=130.0)
    # Asked for one cold start (50 s) before the second in which the audio arrives (99-100 s).
    assert plan[48] == 0 and plan[49] == 1
    assert all(plan[k] == 1 for k in range(49, 140))  # the 20 s gap is shorter than a cold start
    assert plan[140] == 0


def test_live_dispatcher_and_simulator_agree_on_a_short_scripted_trace():
    """One replica taking one request at a time, starting while four requests arrive: both the
    live dispatcher and the simulator hold them and serve them in arrival order, and the
    simulator's latencies follow from the FIFO order (replica ready at 0.6 s, 2 s each)."""
    trace = [TraceRequest(i, 0.1 * i, 5.0) for i in range(4)]
    spec = make_spec(pools=[{"name": "cpu", "accelerator": "cpu", "target": "cpu-x86_64-int8",
                             "replicas": {"min": 0, "max": 1}, "max_concurrency": 1, "cost_usd_per_h": 3.6}])
    res = simulate(spec, trace, [fixed_profile()], RunOptions(cluster="local", replica_slots=1))
    sim_done = sorted(res.requests, key=lambda r: r.arrival_s + (r.latency_s or 0))
    assert [r.id for r in sim_done] == [0, 1, 2, 3]
    assert [round(r.arrival_s + r.latency_s, 3) for r in sim_done] == [2.6, 4.6, 6.6, 8.6]

    async def live() -> list[int]:
        eps = [ReplicaEndpoint("r0", "cpu", "http://127.0.0.1:1", False, 1)]

        class Src:
            def endpoints(self):
                return eps

            def accepting(self):
                return True

            def failure_reason(self):
                return ""

        d = Dispatcher(Src(), max_pending=10, hold_timeout_s=30)
        order: list[int] = []

        async def req(i):
            r = await d.acquire(audio_s=5.0)
            order.append(i)
            await asyncio.sleep(0.01)
            d.release(r.id, audio_s=5.0)

        tasks = []
        for i in range(4):
            tasks.append(asyncio.ensure_future(req(i)))
            await settle(lambda n=i + 1: d.pending == n, f"request {i} held")
        eps[0] = ReplicaEndpoint("r0", "cpu", "http://127.0.0.1:1", True, 1)  # the replica is ready
        d.notify()
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(live()) == [r.id for r in sim_done]


def test_the_simulator_counts_answers_for_the_slo_term_as_the_gateway_does():
    """The scripted trace above with a 5 s SLO: answered at 2.6, 4.6, 6.6 and 8.6 s after
    arrivals at 0-0.3 s, the last two late, all having met no ready replica (it was ready at
    0.6 s), as core.LoadTracker counts them for the gateway."""
    trace = [TraceRequest(i, 0.1 * i, 5.0) for i in range(4)]
    spec = make_spec(pools=[{"name": "cpu", "accelerator": "cpu", "target": "cpu-x86_64-int8",
                             "replicas": {"min": 0, "max": 1}, "max_concurrency": 1, "cost_usd_per_h": 3.6}],
                     autoscaling={"target": 1, "scale_to_zero_after_s": 60, "scale_down_stabilization_s": 0,
                                  "interval_s": 1, "slo_p95_s": 5})
    sim = Simulation(spec, trace, [fixed_profile()], RunOptions(cluster="local", replica_slots=1))
    sim.run()
    assert sim.load.answer_history() == ((0, 0, 2, 0), (1, 0, 2, 2))
