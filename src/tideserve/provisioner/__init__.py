"""Machines for the replicas the autoscaler wants, like Karpenter: an offering catalog
(``catalog``) and pure choices of what to launch and what to remove (``choose``). No I/O."""

from tideserve.provisioner.catalog import (
    AWS_US_EAST_1,
    CAPACITY_TYPES,
    CPU_NODE_BOOT_S,
    GPU_NODE_BOOT_S,
    Offering,
    SpotMarket,
    for_accelerator,
    local_node,
)
from tideserve.provisioner.choose import LaunchPlan, Node, ReplicaRequest, consolidate, plan_launches, replacements

__all__ = [
    "AWS_US_EAST_1",
    "CAPACITY_TYPES",
    "CPU_NODE_BOOT_S",
    "GPU_NODE_BOOT_S",
    "LaunchPlan",
    "Node",
    "Offering",
    "ReplicaRequest",
    "SpotMarket",
    "consolidate",
    "for_accelerator",
    "local_node",
    "plan_launches",
    "replacements",
]
