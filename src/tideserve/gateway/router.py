"""Routing policy (pure): pick the replica with the fewest outstanding requests.

A replica is eligible when it is ready (not starting, draining or failed) and has fewer
outstanding requests than its pool's ``max_concurrency``. Among eligible replicas the one
with the lowest outstanding/max_concurrency ratio wins (least outstanding requests, scaled
so that a replica allowed more concurrency takes proportionally more); ties go to the
replica that was chosen least recently, so equal replicas share load round-robin.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class ReplicaView:
    """What routing needs to know of one replica at decision time."""

    id: str
    ready: bool
    outstanding: int
    max_concurrency: int
    last_chosen: float = 0.0  # monotonic time this replica was last picked (0 = never)


def choose_replica(replicas: Sequence[ReplicaView]) -> str | None:
    """The id of the replica to send the next request to, or None if none can take one."""
    best: ReplicaView | None = None
    for r in replicas:
        if not r.ready or r.outstanding >= r.max_concurrency:
            continue
        if best is None or (r.outstanding / r.max_concurrency, r.last_chosen, r.id) < (
            best.outstanding / best.max_concurrency, best.last_chosen, best.id
        ):
            best = r
    return best.id if best else None
