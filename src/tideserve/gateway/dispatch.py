"""Hold requests until a replica can take them, then hand one out (least outstanding).

``acquire`` waits while no ready replica has free capacity, up to ``hold_timeout_s``; at most
``max_pending`` requests wait at once (then 503 with Retry-After). Every change of replica
state or of outstanding counts wakes the waiters, which re-run the routing policy.
Times (arrivals, the hold deadline, the routing tie-break) come from ``clock``,
``time.monotonic`` unless a test injects one.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable
from tideserve.errors import CapacityError
from tideserve.gateway.holding import hold_deadline, may_hold
from tideserve.gateway.router import ReplicaView, choose_replica
from tideserve.replicas import ReplicaEndpoint, ReplicaSource


#: Weight of the newest sample in the service-time moving average (about the last 10 requests).
EWMA_ALPHA = 0.2


class Dispatcher:
    """Also the gateway's load view for the autoscaler: pending, in-flight and outstanding
    counts, the time of the last arrival, and each pool's measured service rate."""

    def __init__(self, source: ReplicaSource, max_pending: int, hold_timeout_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.source = source
        self.clock = clock
        self.max_pending = max_pending
        self.hold_timeout_s = hold_timeout_s
        self.outstanding: dict[str, int] = {}
        self.pending = 0
        self.on_hold: Callable[[], None] | None = None
        self._last_chosen: dict[str, float] = {}
        self._last_arrival: float | None = None
        self._service_s: dict[str, float] = {}
        self._changed = asyncio.Event()

    def arrived(self) -> None:
        """A request arrived (resets the autoscaler's idle timer, whatever becomes of it)."""
        self._last_arrival = self.clock()

    def last_arrival(self) -> float | None:
        return self._last_arrival

    def outstanding_of(self, replica_id: str) -> int:
        return self.outstanding.get(replica_id, 0)

    def record_service(self, pool: str, seconds: float) -> None:
        """A request finished on ``pool`` after ``seconds`` at the replica."""
        old = self._service_s.get(pool)
        self._service_s[pool] = seconds if old is None else (1 - EWMA_ALPHA) * old + EWMA_ALPHA * seconds

    def service_rates(self) -> dict[str, float]:
        """Measured requests per second one replica of each pool serves (1 / mean service time)."""
        return {p: 1.0 / s for p, s in self._service_s.items() if s > 0}

    def notify(self) -> None:
        """Something changed (replica state, a request finished): waiters re-check."""
        self._changed.set()
        self._changed = asyncio.Event()

    def in_flight(self) -> int:
        return sum(self.outstanding.values())

    def _try_pick(self, exclude: frozenset[str] = frozenset()) -> ReplicaEndpoint | None:
        eps = {e.id: e for e in self.source.endpoints() if e.id not in exclude}
        rates = self.service_rates()
        views = [
            ReplicaView(e.id, e.ready, self.outstanding.get(e.id, 0), e.max_concurrency,
                        self._last_chosen.get(e.id, 0.0), rates.get(e.pool, 1.0))
            for e in eps.values()
        ]
        rid = choose_replica(views)
        if rid is None:
            return None
        self.outstanding[rid] = self.outstanding.get(rid, 0) + 1
        self._last_chosen[rid] = self.clock()
        return eps[rid]

    async def acquire(self, exclude: frozenset[str] = frozenset()) -> ReplicaEndpoint:
        """A replica with a slot reserved for this request; call ``release`` after.

        ``exclude`` names replicas not to use (one that just failed this request), unless
        no other replica exists. Raises CapacityError (503, Retry-After) when the pending queue
        is full, when every pool has failed, or when no slot frees up within ``hold_timeout_s``.
        """
        if exclude and not any(e.id not in exclude for e in self.source.endpoints()):
            exclude = frozenset()
        picked = self._try_pick(exclude)
        if picked is not None:
            return picked
        if not self.source.accepting():
            raise CapacityError(f"no replica can serve this endpoint: {self.source.failure_reason()}", retry_after_s=30)
        if not may_hold(self.pending, self.max_pending):
            raise CapacityError(
                f"too many requests waiting ({self.pending} >= max_pending {self.max_pending}); retry later",
                retry_after_s=1,
            )
        self.pending += 1
        if self.on_hold is not None:
            self.on_hold()  # activation: the autoscaler decides now, not at its next tick
        deadline = hold_deadline(self.clock(), self.hold_timeout_s)
        try:
            while True:
                changed = self._changed
                picked = self._try_pick(exclude)
                if picked is not None:
                    return picked
                if not self.source.accepting():
                    raise CapacityError(f"no replica can serve this endpoint: {self.source.failure_reason()}", retry_after_s=30)
                remaining = deadline - self.clock()
                if remaining <= 0:
                    # Retry soon: a replica is probably starting, and a long wait could outlast
                    # scale_to_zero_after_s and let it go again.
                    raise CapacityError(
                        f"no replica could take the request within hold_timeout_s={self.hold_timeout_s:g}", retry_after_s=1
                    )
                try:
                    # Also wake periodically: replica readiness may change without a notify.
                    await asyncio.wait_for(changed.wait(), min(remaining, 0.5))
                except asyncio.TimeoutError:
                    pass
        finally:
            self.pending -= 1

    def release(self, replica_id: str) -> None:
        n = self.outstanding.get(replica_id, 0) - 1
        if n <= 0:
            self.outstanding.pop(replica_id, None)
        else:
            self.outstanding[replica_id] = n
        self.notify()
