"""The replica view shared by runtimes (which own replicas) and the gateway (which routes).

Neither side imports the other: a runtime produces ``ReplicaEndpoint`` values and satisfies
``ReplicaSource``; the gateway consumes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol
from collections.abc import Sequence


@dataclass(frozen=True)
class ReplicaEndpoint:
    """A replica as the gateway sees it: where it listens and whether it takes requests."""

    id: str
    pool: str
    url: str
    ready: bool
    max_concurrency: int


class ReplicaSource(Protocol):
    """Where replicas come from (the local runtime; later Kubernetes endpoints)."""

    def endpoints(self) -> Sequence[ReplicaEndpoint]: ...

    def accepting(self) -> bool:
        """False when no replica can ever come (every pool failed): fail fast instead of holding."""
        ...

    def failure_reason(self) -> str: ...
