"""The control loop: read the gateway's counts and the runtime's replicas, decide, apply.

Runs every ``autoscaling.interval_s``, and at once when the gateway holds a request that no
replica can take (activation from zero must not wait for the next tick).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Protocol
from collections.abc import Callable, Mapping, Sequence

from tideserve.aio import cancel_and_wait
from tideserve.autoscaler.policy import Decision, PoolSnapshot, ReplicaSnapshot, ScalingState, Snapshot, decide
from tideserve.core import LoadTracker, ReplicaState
from tideserve.spec import EndpointSpec

log = logging.getLogger("tideserve.autoscaler")


class LoadView(Protocol):
    """The gateway's counts (times on the ``time.monotonic`` clock)."""

    @property
    def pending(self) -> int: ...  # read only (the Dispatcher's is a property)

    def in_flight(self) -> int: ...
    def outstanding_of(self, replica_id: str) -> int: ...
    def last_arrival(self) -> float | None: ...
    def service_rates(self) -> Mapping[str, float]: ...
    def work_of(self, replica_id: str) -> float: ...
    def pending_audio_s(self) -> float: ...
    load: LoadTracker


class Actuator(Protocol):
    """The runtime: which replicas each pool has, and applying a decision."""

    def replica_states(self) -> Mapping[str, Sequence[tuple[str, str]]]: ...
    def schedulable(self, pool: str) -> bool: ...
    def slots(self) -> int | None: ...
    async def apply(self, desired: Mapping[str, int], drain: Sequence[str]) -> None: ...


class Autoscaler:
    def __init__(self, spec: EndpointSpec, load: LoadView, actuator: Actuator,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.spec = spec
        self.load = load
        self.actuator = actuator
        self.clock = clock
        self.state = ScalingState()
        self.last: Decision | None = None
        self.last_at: float | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    def wake(self) -> None:
        """Decide now (a request is held with no replica able to take it)."""
        self._wake.set()

    def snapshot(self) -> Snapshot:
        states = self.actuator.replica_states()
        rates = self.load.service_rates()
        tracker = self.load.load
        listed = set()
        for pool, reps_ in states.items():  # the core records when each replica was wanted and ready
            for rid, st in reps_:
                tracker.set_state(rid, pool, ReplicaState(st))
                listed.add(rid)
        for rid, rec in list(tracker.replicas.items()):
            # A replica the runtime no longer lists is gone (drained, deleted): counted as ready
            # for ever otherwise (the SLO term's ready counts). One still finishing work stays.
            if rid not in listed and rec.outstanding == 0:
                tracker.set_state(rid, rec.pool, ReplicaState.STOPPED)
        throughput = tracker.throughput_audio_s()
        cold = tracker.cold_start_s()
        pools = []
        for p in self.spec.pools:
            reps = tuple(
                ReplicaSnapshot(rid, "starting" if st in ("starting", "restarting") else "ready", self.load.outstanding_of(rid),
                                self.load.work_of(rid), tracker.replicas[rid].wanted_at if rid in tracker.replicas else None)
                for rid, st in states.get(p.name, ())
                if st in ("starting", "restarting", "ready")
            )
            pools.append(PoolSnapshot(p.name, p.replicas.min, p.replicas.max, p.cost_usd_per_h, rates.get(p.name),
                                      self.actuator.schedulable(p.name), reps, throughput.get(p.name), cold.get(p.name)))
        rate, rate_at = tracker.arrival_rate_audio_s()
        return Snapshot(self.load.pending, self.load.in_flight(), self.load.last_arrival(), tuple(pools),
                        self.actuator.slots(), self.load.pending_audio_s(), rate, tracker.iat_histogram(), rate_at,
                        tracker.answer_history())

    async def step(self) -> Decision:
        now = self.clock()
        decision, self.state = decide(self.snapshot(), self.spec.autoscaling, self.state, now)
        if self.last is None or (decision.desired, decision.drain) != (self.last.desired, self.last.drain):
            log.info("scaling decision", extra={"desired": dict(decision.desired), "drain": list(decision.drain),
                                                "reason": decision.reason, "inputs": dict(decision.inputs)})
        self.last, self.last_at = decision, now
        await self.actuator.apply(decision.desired, decision.drain)
        return decision

    def status(self) -> dict:
        if self.last is None:
            return {"last_decision": None}
        return {"last_decision": {
            "age_s": round(self.clock() - (self.last_at or 0.0), 3), "desired": dict(self.last.desired),
            "drain": list(self.last.drain), "total": self.last.total, "reason": self.last.reason,
            "inputs": dict(self.last.inputs),
        }}

    async def run(self) -> None:
        while True:
            try:
                await self.step()
            except Exception:
                log.exception("autoscaler step failed")
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.spec.autoscaling.interval_s)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run(), name="autoscaler")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
