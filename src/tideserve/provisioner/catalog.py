"""The offerings machines can be launched from: instance type, accelerators, price, boot time.

Pure data and arithmetic, no I/O. Figures and their sources (sources: docs/facts.md):

- Prices: AWS Price List API, us-east-1, Linux on-demand, $/h (p4d/p5 after AWS's June 2025
  price cut).
- Boot times are ESTIMATES built from Karpenter's published figures, not measurements: a node is
  launched about 1 s after a pod is seen pending and registers 70-80 s after launch
  (aws/karpenter-provider-aws#6128, a CPU node), so ~90 s for a CPU node; a GPU node can take
  minutes more before ``nvidia.com/gpu`` is allocatable (device plugin start), so ~180 s.
- Spot: AWS advertises "up to 90%" off on-demand and discounts vary by type and zone, so the
  discount and the spot availability are parameters (``SpotMarket``), not constants.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Iterable

#: Capacity types an offering can be bought as (Karpenter's ``karpenter.sh/capacity-type``).
CAPACITY_TYPES: tuple[str, ...] = ("on-demand", "spot")

#: Launch-to-ready estimate for a CPU node, s: ~1 s to launch + 70-80 s to registration
#: (Karpenter maintainer's measurement, aws/karpenter-provider-aws#6128), rounded up.
CPU_NODE_BOOT_S = 90.0
#: Launch-to-allocatable-GPU estimate for a GPU node, s: the CPU figure plus time for the
#: NVIDIA device plugin to advertise ``nvidia.com/gpu`` ("minutes", NVIDIA GPU Operator documentation). An estimate.
GPU_NODE_BOOT_S = 180.0

_AWS_SOURCE = "AWS Price List API, us-east-1 Linux on-demand"
_AWS_SOURCE_CUT = _AWS_SOURCE + " (after AWS's June 2025 price cut)"
_BOOT_NOTE = "; boot_s estimated from Karpenter's published start-up figures, not measured"


def check_capacity_type(capacity_type: str, name: str = "capacity_type") -> str:
    """Return ``capacity_type`` if it is "on-demand" or "spot"; raise ValueError naming it."""
    if capacity_type not in CAPACITY_TYPES:
        raise ValueError(f"{name} {capacity_type!r} is unknown; use one of {', '.join(CAPACITY_TYPES)}")
    return capacity_type


@dataclass(frozen=True)
class SpotMarket:
    """Spot conditions at decision time.

    ``discount``: fraction off the on-demand price (0.6 = 60% off). 0.6 is an ASSUMPTION, not a
    measured figure: AWS advertises "up to 90%" and real discounts vary by type and zone
    (AWS Spot pricing page). ``unavailable``: instance types with no spot capacity right now.
    """

    discount: float = 0.6
    unavailable: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not 0.0 <= self.discount < 1.0:
            raise ValueError(f"discount {self.discount!r} must be in [0, 1)")
        object.__setattr__(self, "unavailable", frozenset(self.unavailable))


@dataclass(frozen=True)
class Offering:
    """One instance type. ``accelerator`` is "cpu" or a GPU model as the spec names it (a10g, l4,
    l40s, a100, h100, h200); for "cpu" ``accelerator_count`` is the number of replica slots.
    Memory in GiB (``accelerator_memory_gib`` per accelerator), price in $/h, ``boot_s`` is the
    typical launch-to-ready time in seconds; ``source`` says where the figures come from."""

    instance_type: str
    accelerator: str
    accelerator_count: int
    accelerator_memory_gib: float
    vcpus: int
    memory_gib: float
    on_demand_usd_per_h: float
    boot_s: float
    source: str

    def __post_init__(self) -> None:
        if self.accelerator_count < 1:
            raise ValueError(f"accelerator_count {self.accelerator_count} of {self.instance_type} must be >= 1")
        if self.on_demand_usd_per_h < 0:
            raise ValueError(f"on_demand_usd_per_h {self.on_demand_usd_per_h} of {self.instance_type} must be >= 0")

    def price_usd_per_h(self, capacity_type: str, spot_discount: float) -> float:
        """Price in $/h: on-demand as listed; spot = on-demand x (1 - ``spot_discount``)."""
        check_capacity_type(capacity_type)
        if capacity_type == "spot":
            return self.on_demand_usd_per_h * (1.0 - spot_discount)
        return self.on_demand_usd_per_h


def _gpu(instance_type: str, accelerator: str, count: int, mem_gib: float, vcpus: int, ram_gib: float,
         usd_per_h: float, source: str = _AWS_SOURCE) -> Offering:
    return Offering(instance_type, accelerator, count, mem_gib, vcpus, ram_gib, usd_per_h,
                    GPU_NODE_BOOT_S, source + _BOOT_NOTE)


#: AWS GPU offerings (AWS Price List API, us-east-1, Linux on-demand $/h; GPU memory per GPU
#: as the table lists it).
AWS_US_EAST_1: tuple[Offering, ...] = (
    _gpu("g5.xlarge", "a10g", 1, 24.0, 4, 16.0, 1.006),
    _gpu("g5.2xlarge", "a10g", 1, 24.0, 8, 32.0, 1.212),
    _gpu("g5.12xlarge", "a10g", 4, 24.0, 48, 192.0, 5.672),
    _gpu("g6.xlarge", "l4", 1, 24.0, 4, 16.0, 0.8048),
    _gpu("g6e.xlarge", "l40s", 1, 48.0, 4, 32.0, 1.861),
    _gpu("g6e.2xlarge", "l40s", 1, 48.0, 8, 64.0, 2.24208),
    _gpu("p4d.24xlarge", "a100", 8, 40.0, 96, 1152.0, 21.957642, _AWS_SOURCE_CUT),  # 32.7726 before
    _gpu("p5.48xlarge", "h100", 8, 80.0, 192, 2048.0, 55.04, _AWS_SOURCE_CUT),  # 98.32 before
)


def local_node(replica_slots: int, cost_usd_per_h: float = 0.0) -> Offering:
    """The embedded mode's single machine: instance type "local", accelerator "cpu" with
    ``replica_slots`` slots (one CPU replica each), already running (boot_s 0). vCPUs and memory
    are not tracked (0). ``cost_usd_per_h`` is what the user says the machine costs, $/h."""
    if replica_slots < 1:
        raise ValueError(f"replica_slots {replica_slots} must be >= 1")
    if cost_usd_per_h < 0:
        raise ValueError(f"cost_usd_per_h {cost_usd_per_h} must be >= 0")
    return Offering("local", "cpu", replica_slots, 0.0, 0, 0.0, cost_usd_per_h, 0.0,
                    "this machine (embedded mode); slots from the local config, cost as configured")


def for_accelerator(offerings: Iterable[Offering], accelerator: str) -> tuple[Offering, ...]:
    """The offerings whose accelerator is ``accelerator``, sorted by instance type name."""
    return tuple(sorted((o for o in offerings if o.accelerator == accelerator), key=lambda o: o.instance_type))
