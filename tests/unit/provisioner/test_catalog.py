"""The offering catalog: FACTS.md's AWS table, spot price arithmetic, the local machine."""

from __future__ import annotations

import pytest

from tideserve.provisioner import AWS_US_EAST_1, GPU_NODE_BOOT_S, SpotMarket, for_accelerator, local_node

# AWS Price List API, us-east-1, Linux on-demand $/h (the figures of the shared FACTS.md table):
# instance: (accelerator, GPUs, GPU memory per GPU, vCPU, RAM GiB, $/h)
FACTS = {
    "g5.xlarge": ("a10g", 1, 24.0, 4, 16.0, 1.006),
    "g5.2xlarge": ("a10g", 1, 24.0, 8, 32.0, 1.212),
    "g5.12xlarge": ("a10g", 4, 24.0, 48, 192.0, 5.672),
    "g6.xlarge": ("l4", 1, 24.0, 4, 16.0, 0.8048),
    "g6e.xlarge": ("l40s", 1, 48.0, 4, 32.0, 1.861),
    "g6e.2xlarge": ("l40s", 1, 48.0, 8, 64.0, 2.24208),
    "p4d.24xlarge": ("a100", 8, 40.0, 96, 1152.0, 21.957642),
    "p5.48xlarge": ("h100", 8, 80.0, 192, 2048.0, 55.04),
}


def test_catalog_has_exactly_the_facts_md_types_and_figures():
    assert len(AWS_US_EAST_1) == 8
    got = {o.instance_type: (o.accelerator, o.accelerator_count, o.accelerator_memory_gib, o.vcpus,
                             o.memory_gib, o.on_demand_usd_per_h) for o in AWS_US_EAST_1}
    assert got == FACTS


def test_sources_cite_facts_and_the_june_2025_cut():
    for o in AWS_US_EAST_1:
        assert "AWS Price List API, us-east-1 Linux on-demand" in o.source
        assert "estimated" in o.source  # boot_s is an estimate, not a measurement
        assert o.boot_s == GPU_NODE_BOOT_S == 180.0  # all eight are GPU nodes
    cut = {o.instance_type for o in AWS_US_EAST_1 if "June 2025" in o.source}
    assert cut == {"p4d.24xlarge", "p5.48xlarge"}


def test_spot_price_is_on_demand_times_one_minus_discount():
    g5 = next(o for o in AWS_US_EAST_1 if o.instance_type == "g5.xlarge")
    p5 = next(o for o in AWS_US_EAST_1 if o.instance_type == "p5.48xlarge")
    assert g5.price_usd_per_h("on-demand", 0.6) == 1.006
    assert g5.price_usd_per_h("spot", 0.6) == pytest.approx(0.4024)  # 1.006 * 0.4
    assert p5.price_usd_per_h("spot", 0.7) == pytest.approx(16.512)  # 55.04 * 0.3


def test_unknown_capacity_type_is_named():
    with pytest.raises(ValueError, match="'reserved'"):
        AWS_US_EAST_1[0].price_usd_per_h("reserved", 0.6)


def test_spot_market_defaults_and_checks():
    m = SpotMarket()
    assert m.discount == 0.6 and m.unavailable == frozenset()
    with pytest.raises(ValueError, match="discount"):
        SpotMarket(discount=1.2)


def test_local_node_is_one_cpu_machine_with_slots():
    o = local_node(4, cost_usd_per_h=0.1)
    assert (o.instance_type, o.accelerator, o.accelerator_count, o.boot_s) == ("local", "cpu", 4, 0.0)
    assert o.price_usd_per_h("on-demand", 0.6) == 0.1
    with pytest.raises(ValueError, match="replica_slots"):
        local_node(0)


def test_for_accelerator_filters_and_sorts_by_name():
    assert [o.instance_type for o in for_accelerator(AWS_US_EAST_1, "a10g")] == \
        ["g5.12xlarge", "g5.2xlarge", "g5.xlarge"]  # string order: '1' < '2' < 'x'
    assert for_accelerator(AWS_US_EAST_1, "h200") == ()
