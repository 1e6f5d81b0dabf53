"""Launch planning and consolidation, with expected values worked out by hand from the
FACTS.md prices (g5.xlarge 1.006, g5.2xlarge 1.212, g5.12xlarge 5.672, p5.48xlarge 55.04 $/h)."""

from __future__ import annotations

import pytest

from tideserve.provisioner import (
    AWS_US_EAST_1,
    Node,
    Offering,
    ReplicaRequest,
    SpotMarket,
    consolidate,
    local_node,
    plan_launches,
    replacements,
)

OFF = {o.instance_type: o for o in AWS_US_EAST_1}
MARKET = SpotMarket(discount=0.6)
OD = ("on-demand",)


def types(plan):
    return [(o.instance_type, ct, pools) for o, ct, pools in plan.launches]


def test_one_a10g_replica_on_demand_gets_g5_xlarge():
    plan = plan_launches([ReplicaRequest("gpu", "a10g", 1, OD, 1)], AWS_US_EAST_1, MARKET)
    assert types(plan) == [("g5.xlarge", "on-demand", ("gpu",))]
    assert plan.cost_usd_per_h == 1.006 and plan.unplaceable == ()


def test_four_a10g_replicas_prefer_four_small_nodes():
    # Per replica: g5.xlarge 1.006/1 = 1.006 < g5.2xlarge 1.212 < g5.12xlarge 5.672/4 = 1.418.
    # So 4 x g5.xlarge = 4.024 $/h beats 1 x g5.12xlarge = 5.672 $/h.
    plan = plan_launches([ReplicaRequest("gpu", "a10g", 1, OD, 4)], AWS_US_EAST_1, MARKET)
    assert types(plan) == [("g5.xlarge", "on-demand", ("gpu",))] * 4
    assert plan.cost_usd_per_h == pytest.approx(4.024)


def test_spot_chosen_when_allowed():
    # Spot g5.xlarge: 1.006 * (1 - 0.6) = 0.4024 < on-demand 1.006, whatever the listed order.
    for cts in [("spot", "on-demand"), ("on-demand", "spot")]:
        plan = plan_launches([ReplicaRequest("gpu", "a10g", 1, cts, 1)], AWS_US_EAST_1, MARKET)
        assert types(plan) == [("g5.xlarge", "spot", ("gpu",))]
        assert plan.cost_usd_per_h == pytest.approx(0.4024)


def test_spot_unavailable_for_one_type_picks_next_cheapest_spot():
    # No g5.xlarge spot: g5.2xlarge spot 1.212 * 0.4 = 0.4848 < on-demand g5.xlarge 1.006.
    market = SpotMarket(0.6, frozenset({"g5.xlarge"}))
    plan = plan_launches([ReplicaRequest("gpu", "a10g", 1, ("spot", "on-demand"), 1)], AWS_US_EAST_1, market)
    assert types(plan) == [("g5.2xlarge", "spot", ("gpu",))]
    assert plan.cost_usd_per_h == pytest.approx(0.4848)


def test_spot_unavailable_falls_back_to_on_demand():
    market = SpotMarket(0.6, frozenset({"g5.xlarge", "g5.2xlarge", "g5.12xlarge"}))
    plan = plan_launches([ReplicaRequest("gpu", "a10g", 1, ("spot", "on-demand"), 1)], AWS_US_EAST_1, market)
    assert types(plan) == [("g5.xlarge", "on-demand", ("gpu",))]
    assert plan.cost_usd_per_h == 1.006


def test_spot_only_pool_without_spot_is_unplaceable_with_reason():
    market = SpotMarket(0.6, frozenset({"p5.48xlarge"}))
    plan = plan_launches([ReplicaRequest("h", "h100", 1, ("spot",), 2)], AWS_US_EAST_1, market)
    assert plan.launches == () and plan.cost_usd_per_h == 0
    ((pool, count, why),) = plan.unplaceable
    assert (pool, count) == ("h", 2)
    assert "h100" in why and "tried spot" in why and "p5.48xlarge" in why


def test_h100_replicas_pack_eight_per_p5():
    plan = plan_launches([ReplicaRequest("h", "h100", 1, OD, 8)], AWS_US_EAST_1, MARKET)
    assert types(plan) == [("p5.48xlarge", "on-demand", ("h",) * 8)]
    assert plan.cost_usd_per_h == 55.04


def test_nine_h100_replicas_need_two_nodes():
    plan = plan_launches([ReplicaRequest("h", "h100", 1, OD, 9)], AWS_US_EAST_1, MARKET)
    assert types(plan) == [("p5.48xlarge", "on-demand", ("h",) * 8), ("p5.48xlarge", "on-demand", ("h",))]
    assert plan.cost_usd_per_h == pytest.approx(110.08)  # 2 * 55.04


def test_two_gpu_replica_never_split_across_nodes():
    # "big" needs 2 A10G: only g5.12xlarge (4 GPUs) fits it. Placed first (largest first), that node
    # would hold big + 2 small = 3 replicas: 5.672 / 3 = 1.891 per replica. The 4th small fits
    # nowhere there (free 0) and gets a g5.xlarge: 5.672 + 1.006 = 6.678.
    pending = [ReplicaRequest("small", "a10g", 1, OD, 3), ReplicaRequest("big", "a10g", 2, OD, 1)]
    plan = plan_launches(pending, AWS_US_EAST_1, MARKET)
    assert types(plan) == [("g5.12xlarge", "on-demand", ("big", "small", "small")),
                           ("g5.xlarge", "on-demand", ("small",))]
    assert plan.cost_usd_per_h == pytest.approx(6.678)
    # Three 2-GPU replicas: 2 on one g5.12xlarge, 1 on another, never 1 GPU here and 1 there.
    plan = plan_launches([ReplicaRequest("big", "a10g", 2, OD, 3)], AWS_US_EAST_1, MARKET)
    assert types(plan) == [("g5.12xlarge", "on-demand", ("big", "big")), ("g5.12xlarge", "on-demand", ("big",))]


def test_too_many_gpus_or_unknown_accelerator_is_unplaceable():
    plan = plan_launches([ReplicaRequest("x", "a10g", 8, OD, 1), ReplicaRequest("y", "h200", 1, OD, 2)],
                         AWS_US_EAST_1, MARKET)
    assert plan.launches == ()
    assert plan.unplaceable == (
        ("x", 1, "needs 8 x a10g on one node; the largest a10g offering has 4"),
        ("y", 2, "no offering has accelerator h200"),
    )


def test_existing_free_capacity_used_before_launching():
    # n1 is a g5.12xlarge with 1 of 4 GPUs used: 3 new replicas go there, the 4th launches g5.xlarge.
    n1 = Node("n1", OFF["g5.12xlarge"], "on-demand", ("gpu",), 0.0)
    plan = plan_launches([ReplicaRequest("gpu", "a10g", 1, OD, 4)], AWS_US_EAST_1, MARKET, existing=[n1])
    assert plan.on_existing == (("n1", ("gpu", "gpu", "gpu")),)
    assert types(plan) == [("g5.xlarge", "on-demand", ("gpu",))]
    assert plan.cost_usd_per_h == 1.006


def test_existing_node_of_a_disallowed_capacity_type_is_not_used():
    spot = Node("s1", OFF["g5.12xlarge"], "spot", (), 0.0)
    plan = plan_launches([ReplicaRequest("gpu", "a10g", 1, OD, 1)], AWS_US_EAST_1, MARKET, existing=[spot])
    assert plan.on_existing == () and types(plan) == [("g5.xlarge", "on-demand", ("gpu",))]


def test_existing_replicas_use_the_per_pool_accelerator_count():
    # n1 holds one replica of "pair" (2 GPUs each): free 4 - 2 = 2, so only 2 of 3 fit.
    n1 = Node("n1", OFF["g5.12xlarge"], "on-demand", ("pair",), 0.0)
    plan = plan_launches([ReplicaRequest("gpu", "a10g", 1, OD, 3)], AWS_US_EAST_1, MARKET, existing=[n1],
                         accelerators_per_replica={"pair": 2})
    assert plan.on_existing == (("n1", ("gpu", "gpu")),)
    assert types(plan) == [("g5.xlarge", "on-demand", ("gpu",))]


def test_local_node_holds_its_slots_and_no_more():
    local = Node("local", local_node(4), "on-demand", (), None)
    plan = plan_launches([ReplicaRequest("cpu", "cpu", 1, OD, 5)], (), MARKET, existing=[local])
    assert plan.on_existing == (("local", ("cpu",) * 4),)
    assert plan.launches == () and plan.cost_usd_per_h == 0
    assert plan.unplaceable == (("cpu", 1, "no offering has accelerator cpu"),)


def test_ties_broken_by_instance_type_name():
    b = Offering("b.large", "l4", 1, 24.0, 4, 16.0, 1.0, 180.0, "test")
    a = Offering("a.large", "l4", 1, 24.0, 4, 16.0, 1.0, 180.0, "test")
    plan = plan_launches([ReplicaRequest("p", "l4", 1, OD, 1)], [b, a], MARKET)
    assert types(plan) == [("a.large", "on-demand", ("p",))]


def test_same_input_same_output_whatever_the_order():
    pending = [ReplicaRequest("a", "a10g", 1, ("spot", "on-demand"), 5), ReplicaRequest("b", "a10g", 2, OD, 3),
               ReplicaRequest("h", "h100", 1, OD, 9), ReplicaRequest("z", "h200", 1, OD, 1)]
    existing = [Node("n2", OFF["g5.12xlarge"], "on-demand", ("b",), 0.0), Node("n1", OFF["g6.xlarge"], "spot", (), 0.0)]
    first = plan_launches(pending, AWS_US_EAST_1, MARKET, existing)
    assert plan_launches(pending, AWS_US_EAST_1, MARKET, existing) == first
    assert plan_launches(pending[::-1], AWS_US_EAST_1[::-1], MARKET, existing[::-1]) == first


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="count -1"):
        ReplicaRequest("p", "a10g", 1, OD, -1)
    with pytest.raises(ValueError, match="'reserved'"):
        ReplicaRequest("p", "a10g", 1, ("reserved",), 1)
    with pytest.raises(ValueError, match="capacity_types"):
        ReplicaRequest("p", "a10g", 1, (), 1)
    with pytest.raises(ValueError, match="capacity_type of node 'n'"):
        Node("n", OFF["g5.xlarge"], "preemptible")
    with pytest.raises(ValueError, match="min_age_s"):
        consolidate([], MARKET, now=0.0, min_age_s=-1)
    with pytest.raises(ValueError, match="unique"):
        plan_launches([], AWS_US_EAST_1, MARKET, [Node("n", OFF["g5.xlarge"], "spot")] * 2)


# --- consolidation ---------------------------------------------------------------------------


def test_empty_nodes_removed_once_old_enough():
    nodes = [
        Node("old", OFF["g5.xlarge"], "on-demand", (), 0.0),      # age 100 s >= 30 s: removed
        Node("young", OFF["g5.xlarge"], "on-demand", (), 90.0),   # age 10 s < 30 s: kept
        Node("local", local_node(4), "on-demand", (), None),      # not ours to remove: kept
    ]
    assert consolidate(nodes, MARKET, now=100.0, min_age_s=30.0) == ("old",)


def test_under_used_node_removed_when_its_replicas_fit_elsewhere():
    # big: g5.12xlarge, 3 of 4 used (free 1); small: g5.xlarge, 1 replica.
    # Most expensive first: big's 3 replicas do not fit small (free 0): kept.
    # small's 1 replica fits big's free GPU: small removed.
    nodes = [Node("big", OFF["g5.12xlarge"], "on-demand", ("a", "a", "a"), 0.0),
             Node("small", OFF["g5.xlarge"], "on-demand", ("a",), 0.0)]
    assert consolidate(nodes, MARKET, now=10.0) == ("small",)


def test_node_kept_when_its_replicas_do_not_fit():
    nodes = [Node("n1", OFF["g5.xlarge"], "on-demand", ("a",), 0.0),
             Node("n2", OFF["g5.xlarge"], "on-demand", ("a",), 0.0)]
    assert consolidate(nodes, MARKET, now=10.0) == ()
    # A 2-GPU replica does not fit one free GPU.
    nodes = [Node("n1", OFF["g5.12xlarge"], "on-demand", ("pair",), 0.0),
             Node("n2", OFF["g5.12xlarge"], "on-demand", ("a", "a", "a"), 0.0)]
    assert consolidate(nodes, MARKET, now=10.0, accelerators_per_replica={"pair": 2}) == ()


def test_most_expensive_removed_first_and_moves_are_counted():
    # Both g5.12xlarge with 2 of 4 used; od costs 5.672, spot 5.672 * 0.4 = 2.2688.
    # od goes first (by name aa-spot would): its 2 replicas fill aa-spot, which then stays.
    nodes = [Node("od", OFF["g5.12xlarge"], "on-demand", ("a", "a"), 0.0),
             Node("aa-spot", OFF["g5.12xlarge"], "spot", ("a", "a"), 0.0)]
    assert consolidate(nodes, MARKET, now=10.0) == ("od",)


def test_moves_respect_capacity_types_and_age():
    nodes = [Node("od", OFF["g5.12xlarge"], "on-demand", ("s",), 0.0),
             Node("sp", OFF["g5.12xlarge"], "spot", ("o",), 0.0)]
    # s may run on spot only, o on on-demand only: od (5.672 > 2.2688 $/h) goes first, its "s"
    # moves to sp; sp's "o" could only go to od, which is gone: sp stays.
    assert consolidate(nodes, MARKET, now=10.0, capacity_types={"s": ("spot",), "o": ("on-demand",)}) == ("od",)
    # s on-demand only: od's "s" cannot move to sp, so od stays; sp's "o" (any type) moves to od.
    assert consolidate(nodes, MARKET, now=10.0, capacity_types={"s": ("on-demand",)}) == ("sp",)
    # Too young: nothing moves.
    assert consolidate(nodes, MARKET, now=10.0, min_age_s=60.0) == ()


def test_consolidate_is_deterministic():
    # Replicas (each 1 GPU of 4): n0 0, n1 1, n2 2, n3 0, n4 1, n5 2; all old, all 5.672 $/h.
    # Empty n0, n3 go. By name: n1's 1 -> n2 (free 2 -> 1), n1 goes; n2's 3 -> n4 (free 3 -> 0),
    # n2 goes; n4 (4 used) and n5 (2 used) have no room for each other: kept. 6 replicas remain placed.
    nodes = [Node(f"n{i}", OFF["g5.12xlarge"], "on-demand", ("a",) * (i % 3), float(i)) for i in range(6)]
    first = consolidate(nodes, MARKET, now=100.0)
    assert first == ("n0", "n3", "n1", "n2")
    assert consolidate(nodes[::-1], MARKET, now=100.0) == first


def test_replacements_name_on_demand_nodes_a_cheaper_spot_node_would_replace():
    """Karpenter's consolidation by replacement: an on-demand g5.xlarge (1.006 $/h) whose replica
    may run on spot is replaced by a spot g5.xlarge (0.4024 $/h) once spot has capacity; not while
    it has none, not when the pool is on-demand only, not a young node, not a spot node."""
    shapes = {"a": ReplicaRequest("a", "a10g", 1, ("spot", "on-demand")), "od": ReplicaRequest("od", "a10g", 1, OD)}
    nodes = [Node("n1", OFF["g5.xlarge"], "on-demand", ("a",), 0.0),
             Node("n2", OFF["g5.xlarge"], "on-demand", ("od",), 0.0),
             Node("young", OFF["g5.xlarge"], "on-demand", ("a",), 90.0),
             Node("cheap", OFF["g5.xlarge"], "spot", ("a",), 0.0),
             Node("empty", OFF["g5.xlarge"], "on-demand", (), 0.0)]
    assert replacements(nodes, shapes, AWS_US_EAST_1, MARKET, now=100.0, min_age_s=30.0) == ("n1",)
    no_spot = SpotMarket(0.6, frozenset({"g5.xlarge", "g5.2xlarge", "g5.12xlarge"}))
    assert replacements(nodes, shapes, AWS_US_EAST_1, no_spot, now=100.0, min_age_s=30.0) == ()
    # Three replicas on an on-demand g5.12xlarge (5.672 $/h): plan_launches would put them on three
    # spot g5.xlarge; a replacement is ONE node (Karpenter replaces one node by one), so none.
    big = [Node("big", OFF["g5.12xlarge"], "on-demand", ("a", "a", "a"), 0.0)]
    assert replacements(big, shapes, AWS_US_EAST_1, MARKET, now=100.0) == ()
    assert replacements(nodes, {}, AWS_US_EAST_1, MARKET, now=100.0) == ()  # pools it does not know: left alone
    with pytest.raises(ValueError, match="min_age_s"):
        replacements(big, shapes, AWS_US_EAST_1, MARKET, now=100.0, min_age_s=-1)

