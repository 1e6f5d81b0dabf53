"""The serving core: FIFO hold queue, applying a decision, load tracking, replica states."""

from __future__ import annotations

import pytest

from tideserve.core import HoldQueue, LoadTracker, ReplicaState, plan_apply


def test_hold_queue_releases_first_in_first_out_and_stops_at_the_first_it_cannot_place():
    q: HoldQueue[str] = HoldQueue(max_pending=3, hold_timeout_s=10)
    for i, t in enumerate((0.0, 1.0, 2.0)):
        assert q.may_hold()
        assert q.push(f"r{i}", t, audio_s=5.0) == t + 10
    assert not q.may_hold() and q.audio_s() == 15.0
    slots = ["a"]
    assert q.release(lambda item: bool(slots) and bool(slots.pop())) == ["r0"]  # one slot: the oldest
    assert [h.item for h in q] == ["r1", "r2"]
    assert q.expire(11.0) == ["r1"] and q.expire(11.5) == [] and len(q) == 1


def test_plan_apply_stops_unstarted_drains_ready_and_adds_to_desired():
    reps = [("a", "p", ReplicaState.READY), ("b", "p", ReplicaState.STARTING), ("c", "p", ReplicaState.WAITING),
            ("d", "p", ReplicaState.DRAINING), ("e", "q", ReplicaState.READY)]
    plan = plan_apply(reps, {"p": 1, "q": 3}, ["a", "b"])
    assert plan.stop == ("b",) and plan.drain == ("a",) and dict(plan.add) == {"q": 2}


def test_load_tracker_work_throughput_cold_start_and_arrivals():
    now = [0.0]
    t = LoadTracker(lambda: now[0])
    t.record("r1", "gpu", ReplicaState.WAITING)
    now[0] = 30.0
    t.set_state("r1", "gpu", ReplicaState.READY)
    assert t.cold_start_s() == {"gpu": 30.0}
    t.set_state("r0", "gpu", ReplicaState.READY)  # found ready: no cold start observed
    assert t.cold_start_s() == {"gpu": 30.0}
    t.arrived(10.0)
    t.dispatched("r1", "gpu", 10.0)
    t.dispatched("r1", "gpu", 20.0)
    assert t.work_of("r1") == 30.0 and t.in_flight() == 2
    now[0] = 31.0
    t.arrived(20.0)
    assert t.iat_histogram()[0] == 1  # one gap of 1 s
    now[0] = 32.0
    t.finished("r1", 10.0, service_s=2.0)
    now[0] = 33.0
    t.finished("r1", 20.0, service_s=3.0)
    assert t.work_of("r1") == 0.0 and t.service_rates()["gpu"] == pytest.approx(1 / (0.8 * 2 + 0.2 * 3))
    # 30 audio-s over the 3 s r1 was busy (decay over 3 s is small).
    assert t.throughput_audio_s()["gpu"] == pytest.approx(10.0, rel=0.05)
    now[0] = 40.0
    assert t.throughput_audio_s()["gpu"] == pytest.approx(10.0, rel=0.05)  # unchanged load, same value
    rate, at = t.arrival_rate_audio_s()
    assert rate > 0 and at == 31.0
    t.set_state("r1", "gpu", ReplicaState.STOPPED)
    assert "r1" not in t.replicas


def test_states_counted_as_capacity():
    assert {s for s in ReplicaState if s.counts_as_capacity} == {
        ReplicaState.WAITING, ReplicaState.STARTING, ReplicaState.READY, ReplicaState.RESTARTING}
    assert ReplicaState.READY == "ready"  # the strings the status page shows


def test_answers_are_counted_per_5_s_with_the_ready_replicas_and_kept_an_hour():
    now = [0.0]
    t = LoadTracker(lambda: now[0])
    t.set_state("a", "gpu", ReplicaState.READY)
    t.set_state("b", "gpu", ReplicaState.STARTING)  # not ready: not counted
    for at, latency in ((1.0, 2.0), (2.0, 16.0), (4.9, None)):  # None: refused or timed out, a miss
        now[0] = at
        t.answered(latency, slo_s=15.0, audio_s=10.0)
    now[0] = 6.0
    t.answered(20.0, slo_s=15.0, audio_s=31.0)  # longer than one window: its length, not capacity
    t.set_state("b", "gpu", ReplicaState.READY)
    t.answered(3.0, slo_s=15.0, audio_s=5.0)
    t.answered(16.0, slo_s=15.0, ready=1)  # it met one replica when it arrived
    assert t.ready_count() == 2
    assert t.answer_history() == ((0, 1, 3, 2), (1, 1, 1, 1), (1, 2, 1, 0))
    now[0] = 3600.0 + 7.0  # bin 721: bin 0 and 1 are now more than an hour old
    t.answered(1.0, slo_s=15.0)
    assert t.answer_history() == ((721, 2, 1, 0),)
