"""A runtime whose replicas are discovered, not started: the gateway's Kubernetes mode.

Replicas are the pods some other system runs (Kubernetes Deployments scaled by KEDA and the
HPA); a discovery adapter (``runtime.dns``, or a static list in tests) reports each pool's
ready replica URLs through ``set_replicas``. Every discovered replica is ``ready``: the
headless Service lists only pods whose readiness probe passed.

As the autoscaler's actuator, ``apply`` starts and stops nothing: it records each pool's
desired replicas, which the external scaler publishes to KEDA (which scales the
Deployments). The drain list is ignored: Kubernetes picks the pods to remove, and a worker's
preStop hook drains it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from collections.abc import Callable, Mapping, Sequence

from tideserve.replicas import ReplicaEndpoint
from tideserve.spec import InferenceEndpoint

#: A replica the gateway could not reach (or that said it is not ready) is left out of routing this long, or until discovery
#: stops listing it (its readiness probe fails) — whichever comes first.
SUSPECT_S = 5.0


@dataclass
class _Replica:
    id: str
    url: str
    since: float
    suspect_until: float = 0.0


class DiscoveredRuntime:
    """Pools of discovered replicas; the gateway's ``Runtime`` and the autoscaler's ``Actuator``.

    ``source`` names the discovery in ``status()`` (``dns`` or ``static``); ``namespace`` is
    informational. ``clock`` is ``time.monotonic`` unless a test injects one.
    """

    def __init__(self, endpoint: InferenceEndpoint, source: str = "dns", namespace: str | None = None,
                 clock: Callable[[], float] = time.monotonic, suspect_s: float = SUSPECT_S) -> None:
        self.endpoint = endpoint
        self.source = source
        self.namespace = namespace
        self.clock = clock
        self.suspect_s = suspect_s
        self.pools = {p.name: p for p in endpoint.spec.pools}
        self._replicas: dict[str, dict[str, _Replica]] = {p: {} for p in self.pools}
        self._desired: dict[str, int] = {p: 0 for p in self.pools}
        self._decided = False
        self._seconds_done: dict[str, float] = {p: 0.0 for p in self.pools}
        self._errors: dict[str, str] = {}
        self._listeners: list[Callable[[], None]] = []
        self._desired_listeners: list[Callable[[], None]] = []
        self._stopping = False

    # --- discovery side ---------------------------------------------------------------------
    def set_replicas(self, pool: str, urls: Sequence[str]) -> None:
        """The pool's ready replicas are now exactly ``urls``. Raises KeyError for an unknown pool."""
        if pool not in self.pools:
            raise KeyError(f"unknown pool '{pool}'; the endpoint has pools {', '.join(self.pools)}")
        now = self.clock()
        current = self._replicas[pool]
        wanted = {f"{pool}@{u.removeprefix('http://').removeprefix('https://')}": u for u in urls}
        changed = False
        for rid in list(current):
            if rid not in wanted:
                self._seconds_done[pool] += now - current.pop(rid).since
                changed = True
        for rid, url in wanted.items():
            if rid not in current:
                current[rid] = _Replica(rid, url, now)
                changed = True
        if changed:
            self._notify()

    def set_error(self, pool: str, reason: str | None) -> None:
        """A discovery problem for ``pool`` (None: resolved), shown in ``status()``."""
        if reason:
            self._errors[pool] = reason
        else:
            self._errors.pop(pool, None)

    # --- the gateway's Runtime ----------------------------------------------------------------
    def add_listener(self, cb: Callable[[], None]) -> None:
        """``cb()`` whenever replicas come, go or change readiness (the dispatcher re-checks)."""
        self._listeners.append(cb)

    def on_desired(self, cb: Callable[[], None]) -> None:
        """``cb()`` after every decision applied (the external scaler re-publishes)."""
        self._desired_listeners.append(cb)

    def endpoints(self) -> list[ReplicaEndpoint]:
        now = self.clock()
        return [
            ReplicaEndpoint(r.id, pool, r.url, now >= r.suspect_until, self.pools[pool].max_concurrency)
            for pool, reps in self._replicas.items() for r in reps.values()
        ]

    def accepting(self) -> bool:
        # Pods may always come (KEDA activates a pool when requests are held): hold, don't fail.
        return not self._stopping

    def failure_reason(self) -> str:
        return "the gateway is stopping"

    def report_unreachable(self, replica_id: str) -> None:
        for reps in self._replicas.values():
            r = reps.get(replica_id)
            if r is not None:
                r.suspect_until = self.clock() + self.suspect_s
                self._notify()

    def status(self) -> dict:
        now = self.clock()
        pools = []
        for name, spec in self.pools.items():
            reps = self._replicas[name]
            pools.append({
                "name": name, "accelerator": spec.accelerator, "target": spec.target,
                "state": "running", "reason": self._errors.get(name, ""),
                "desired": self._desired[name], "ready": sum(now >= r.suspect_until for r in reps.values()),
                "min": spec.replicas.min, "max": spec.replicas.max, "max_concurrency": spec.max_concurrency,
                "replica_seconds": round(self._seconds_done[name] + sum(now - r.since for r in reps.values()), 3),
                "replicas": [
                    {"id": r.id, "state": "ready" if now >= r.suspect_until else "suspect", "url": r.url,
                     "pid": None, "restarts": 0, "last_exit": None, "uptime_s": round(now - r.since, 1)}
                    for r in reps.values()
                ],
            })
        return {"runtime": "kubernetes", "discovery": self.source, "namespace": self.namespace,
                "started": True, "decided": self._decided, "pools": pools}

    def scrape_targets(self) -> list[dict]:
        ep = self.endpoint.metadata.name
        return [
            {"targets": [e.url.split("://", 1)[-1]], "labels": {"endpoint": ep, "pool": e.pool, "replica": e.id}}
            for e in self.endpoints()
        ]

    def stop(self) -> None:
        self._stopping = True
        self._notify()

    # --- the autoscaler's Actuator ------------------------------------------------------------
    def replica_states(self) -> dict[str, list[tuple[str, str]]]:
        return {pool: [(r.id, "ready") for r in reps.values()] for pool, reps in self._replicas.items()}

    def schedulable(self, pool: str) -> bool:
        return True

    def slots(self) -> int | None:
        return None

    async def apply(self, desired: Mapping[str, int], drain: Sequence[str]) -> None:
        """Record each pool's desired replicas (KEDA and the HPA act on them); ``drain`` is ignored."""
        for pool, n in desired.items():
            self._desired[pool] = n
        self._decided = True
        for cb in list(self._desired_listeners):
            cb()

    def desired(self, pool: str) -> int:
        """The latest decision's desired replicas for ``pool`` (0 before any decision)."""
        return self._desired[pool]

    def _notify(self) -> None:
        for cb in list(self._listeners):
            cb()
