"""Routing policy (pure): least outstanding requests, weighed by measured service rate.

A replica is eligible when it is ready (not starting, draining or failed) and has fewer
outstanding requests than its pool's ``max_concurrency``. Among eligible replicas the one
that would finish the new request soonest wins: the lowest (outstanding + 1) / service_rate,
where service_rate is the measured requests per second of the replica's pool (equal rates:
plain least outstanding requests). Ties go to the replica chosen least recently, so equal
replicas share load round-robin.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence


@dataclass(frozen=True)
class ReplicaView:
    """What routing needs to know of one replica at decision time."""

    id: str
    ready: bool
    outstanding: int
    max_concurrency: int
    last_chosen: float = 0.0  # monotonic time this replica was last picked (0 = never)
    service_rate: float = 1.0  # requests/s; only ratios between replicas matter


def choose_replica(replicas: Sequence[ReplicaView]) -> str | None:
    """The id of the replica to send the next request to, or None if none can take one."""
    best: ReplicaView | None = None
    for r in replicas:
        if not r.ready or r.outstanding >= r.max_concurrency:
            continue
        if best is None or ((r.outstanding + 1) / r.service_rate, r.last_chosen, r.id) < (
            (best.outstanding + 1) / best.service_rate, best.last_chosen, best.id
        ):
            best = r
    return best.id if best else None
