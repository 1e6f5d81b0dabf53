"""Each rule of the autoscaling policy, on a stepped clock."""

from __future__ import annotations

from tideserve.autoscaler import PoolSnapshot, ReplicaSnapshot, ScalingState, Snapshot, decide, place
from tideserve.spec import Autoscaling

SPEC = Autoscaling(target=4, scale_to_zero_after_s=60, scale_down_stabilization_s=30)


def pool(name="cpu", n=0, mn=0, mx=10, cost=1.0, rate=None, outstanding=(), states=(), schedulable=True):
    reps = []
    for i in range(n):
        reps.append(ReplicaSnapshot(f"{name}-{i}", states[i] if i < len(states) else "ready",
                                    outstanding[i] if i < len(outstanding) else 0))
    return PoolSnapshot(name, mn, mx, cost, rate, schedulable, tuple(reps))


def snap(pending=0, in_flight=0, last=None, pools=None, slots=None):
    return Snapshot(pending, in_flight, last, tuple(pools or [pool()]), slots)


def test_desired_is_ceil_of_load_over_target():
    d, _ = decide(snap(pending=3, in_flight=6, last=0.0, pools=[pool(n=1)]), SPEC, ScalingState(), 1.0)
    assert d.desired == {"cpu": 3} and d.total == 3  # ceil(9 / 4)


def test_within_tolerance_nothing_changes():
    # 2 replicas, target 4: load 8.6 -> ratio 1.075, inside 10%: stay at 2 (ceil would say 3).
    d, _ = decide(snap(pending=0, in_flight=9, last=0.0, pools=[pool(n=2)]),
                  Autoscaling(target=4.2, scale_to_zero_after_s=60), ScalingState(), 1.0)
    assert d.total == 2 and "within tolerance" in d.reason
    d, _ = decide(snap(in_flight=10, last=0.0, pools=[pool(n=2)]), SPEC, ScalingState(), 1.0)
    assert d.total == 3  # ratio 1.25: outside


def test_scale_up_is_immediate():
    st = ScalingState()
    d, st = decide(snap(in_flight=4, last=0.0, pools=[pool(n=1)]), SPEC, st, 0.0)
    assert d.total == 1
    d, st = decide(snap(in_flight=40, last=1.0, pools=[pool(n=1)]), SPEC, st, 1.0)
    assert d.total == 10


def test_scale_down_only_to_the_highest_recommendation_in_the_window():
    st = ScalingState()
    d, st = decide(snap(in_flight=32, last=0.0, pools=[pool(n=8)]), SPEC, st, 0.0)
    assert d.total == 8
    d, st = decide(snap(in_flight=8, last=10.0, pools=[pool(n=8)]), SPEC, st, 10.0)
    assert d.total == 8 and "stabilization window" in d.reason
    d, st = decide(snap(in_flight=8, last=29.0, pools=[pool(n=8)]), SPEC, st, 29.9)
    assert d.total == 8
    d, st = decide(snap(in_flight=8, last=30.0, pools=[pool(n=8)]), SPEC, st, 30.0)
    assert d.total == 2  # the 8 was recommended 30 s ago: out of the window


def test_one_replica_kept_until_no_arrival_for_scale_to_zero_after_s():
    st = ScalingState()
    d, st = decide(snap(last=0.0, pools=[pool(n=1)]), SPEC, st, 59.9)
    assert d.total == 1 and "scale_to_zero_after_s" in d.reason
    d, st = decide(snap(last=0.0, pools=[pool(n=1)]), SPEC, st, 60.0)
    assert d.total == 0 and d.drain == ("cpu-0",)


def test_every_arrival_resets_the_idle_timer():
    st = ScalingState()
    # Short requests arrive at 0 s and 50 s; none is in flight when the policy looks.
    d, st = decide(snap(last=50.0, pools=[pool(n=1)]), SPEC, st, 100.0)
    assert d.total == 1
    d, st = decide(snap(last=50.0, pools=[pool(n=1)]), SPEC, st, 110.0)
    assert d.total == 0


def test_scale_to_zero_respects_min():
    d, _ = decide(snap(last=0.0, pools=[pool(n=2, mn=1)]), SPEC, ScalingState(), 1000.0)
    assert d.total == 1 and len(d.drain) == 1


def test_activation_from_zero_at_once():
    d, _ = decide(snap(pending=1, last=100.0, pools=[pool(n=0)]), SPEC, ScalingState(), 100.0)
    assert d.total == 1 and "activation" in d.reason
    d, _ = decide(snap(pending=9, last=100.0, pools=[pool(n=0)]), SPEC, ScalingState(), 100.0)
    assert d.total == 3


def test_long_request_in_flight_keeps_its_replica_past_the_idle_timer():
    d, _ = decide(snap(in_flight=1, last=0.0, pools=[pool(n=1)]), SPEC, ScalingState(), 500.0)
    assert d.total == 1 and d.drain == ()


def test_cheapest_per_service_rate_first_and_removal_from_the_most_expensive():
    # fast: $2/h at 4 req/s = 0.5 $/h per req/s; slow: $1/h at 1 req/s = 1.0: fast is cheaper per unit.
    fast = pool("fast", n=0, mx=2, cost=2.0, rate=4.0)
    slow = pool("slow", n=0, mx=4, cost=1.0, rate=1.0)
    assert place(1, (slow, fast)) == {"slow": 0, "fast": 1}
    assert place(3, (slow, fast)) == {"slow": 1, "fast": 2}
    assert place(6, (slow, fast)) == {"slow": 4, "fast": 2}
    # Scaling from 3 down to 2 removes from slow, the more expensive per unit.
    cur = (pool("slow", n=1, mx=4, cost=1.0, rate=1.0), pool("fast", n=2, mx=2, cost=2.0, rate=4.0))
    d, _ = decide(snap(in_flight=8, last=0.0, pools=list(cur)), SPEC, ScalingState(), 1.0)
    assert d.desired == {"slow": 0, "fast": 2} and d.drain == ("slow-0",)


def test_unmeasured_pools_use_the_mean_measured_rate_and_cost_breaks_ties():
    a = pool("a", mx=3, cost=1.0, rate=None)
    b = pool("b", mx=3, cost=0.5, rate=None)
    assert place(2, (a, b)) == {"a": 0, "b": 2}


def test_pool_mins_and_max_and_slots():
    a = pool("a", mn=1, mx=2, cost=1.0)
    b = pool("b", mn=1, mx=5, cost=2.0)
    assert place(0, (a, b)) == {"a": 1, "b": 1}
    assert place(10, (a, b)) == {"a": 2, "b": 5}
    assert place(10, (a, b), slots=4) == {"a": 2, "b": 2}
    d, _ = decide(snap(in_flight=100, last=0.0, pools=[a, b], slots=3), SPEC, ScalingState(), 0.0)
    assert d.total == 3 and "clamped" in d.reason


def test_unschedulable_pool_gets_nothing():
    bad = pool("gpu", n=0, mn=1, mx=4, cost=0.1, schedulable=False)
    cpu = pool("cpu", n=1, mx=4, cost=1.0)
    d, _ = decide(snap(in_flight=8, last=0.0, pools=[bad, cpu]), SPEC, ScalingState(), 0.0)
    assert d.desired == {"gpu": 0, "cpu": 2}


def test_the_replica_with_the_least_work_is_drained():
    p = pool(n=3, outstanding=(2, 0, 5))
    d, _ = decide(snap(in_flight=7, last=0.0, pools=[p]), Autoscaling(target=4, scale_down_stabilization_s=0), ScalingState(), 0.0)
    assert d.total == 2 and d.drain == ("cpu-1",)
    p = pool(n=3, outstanding=(0, 0, 3), states=("ready", "starting", "ready"))
    d, _ = decide(snap(in_flight=3, last=0.0, pools=[p]), Autoscaling(target=4, scale_down_stabilization_s=0), ScalingState(), 0.0)
    assert d.total == 1 and set(d.drain) == {"cpu-1", "cpu-0"}


def test_decision_is_pure():
    s, st = snap(pending=5, in_flight=3, last=1.0, pools=[pool(n=2)]), ScalingState(((0.5, 3),))
    assert decide(s, SPEC, st, 2.0) == decide(s, SPEC, st, 2.0)


def test_a_ready_replica_moved_to_a_cheaper_pool_is_kept_until_its_replacement_is_ready():
    """Make before break: placement prefers the cheaper a10g pool, but the ready l40s replica
    serves until the a10g one is ready (it used to be drained at once: requests then waited the
    whole cold start). Where the machine has no slot for both, nothing is kept."""
    from tideserve.autoscaler.policy import PoolSnapshot, ReplicaSnapshot, Snapshot, settle

    def snap(a10g: tuple, l40s: tuple, slots=None) -> Snapshot:
        return Snapshot(pending=3, in_flight=0, last_arrival=0.0, slots=slots, pools=(
            PoolSnapshot("a10g", 0, 4, cost_usd_per_h=1.0, service_rate=1.0, replicas=a10g),
            PoolSnapshot("l40s", 0, 4, cost_usd_per_h=2.0, service_rate=1.0, replicas=l40s)))

    l40s_ready = (ReplicaSnapshot("l40s-1", "ready"),)
    first = settle(snap((), l40s_ready), 1, "need 1")
    assert first.desired == {"a10g": 1, "l40s": 1} and first.drain == ()
    assert "keeps 1 ready replica(s) of l40s until a10g has its new ones ready" in first.reason
    starting = settle(snap((ReplicaSnapshot("a10g-1", "starting"),), l40s_ready), 1, "need 1")
    assert starting.desired == {"a10g": 1, "l40s": 1}
    ready = settle(snap((ReplicaSnapshot("a10g-1", "ready"),), l40s_ready), 1, "need 1")
    assert ready.desired == {"a10g": 1, "l40s": 0} and ready.drain == ("l40s-1",)
    no_slot = settle(snap((), l40s_ready, slots=1), 1, "need 1")
    assert no_slot.desired == {"a10g": 1, "l40s": 0}
