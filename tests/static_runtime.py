"""A runtime stand-in for gateway tests: fixed replica endpoints, always accepting. A replica
reported unreachable (or answering 503) fails the test unless a subclass says otherwise."""

from __future__ import annotations

from tideserve.replicas import ReplicaEndpoint


class StaticRuntime:
    def __init__(self, eps: list[ReplicaEndpoint]) -> None:
        self.eps = eps

    def endpoints(self) -> list[ReplicaEndpoint]:
        return self.eps

    def accepting(self) -> bool:
        return True

    def failure_reason(self) -> str:
        return ""

    def status(self) -> dict:
        pools = dict.fromkeys(e.pool for e in self.eps)
        return {"pools": [{"name": p, "replica_seconds": 0.0, "state": "running", "replicas": []} for p in pools]}

    def report_unreachable(self, replica_id: str) -> None:
        raise AssertionError(f"{replica_id} reported unreachable")

    def scrape_targets(self) -> list[dict]:
        return []
