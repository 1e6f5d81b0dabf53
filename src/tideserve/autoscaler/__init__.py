"""Replica autoscaling: a pure policy (``policy.decide``) and a control loop that applies it."""

from tideserve.autoscaler.policy import (
    Decision,
    PoolSnapshot,
    ReplicaSnapshot,
    ScalingState,
    Snapshot,
    decide,
    place,
)

__all__ = ["Decision", "PoolSnapshot", "ReplicaSnapshot", "ScalingState", "Snapshot", "decide", "place"]
