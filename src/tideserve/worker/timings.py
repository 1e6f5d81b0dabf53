"""Time accounting shared by the backends, the engine and the worker's HTTP layer.

The batching decision itself is the pure ``tideserve.worker.batching.cut_batch`` (static
backends) and the engine's slot admission (continuous backends), both run by
``tideserve.worker.engine.EngineLoop`` in the engine process.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ExecutionTimings:
    """Seconds one execution spent in each phase (Triton's compute input/infer/output split)."""

    input_s: float = 0.0
    infer_s: float = 0.0
    output_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.input_s + self.infer_s + self.output_s


@dataclass
class Usage:
    """Model time one caller used: the executions its items ran in, each counted once
    (as Triton charges every request of a batch the whole execution)."""

    compute_s: float = 0.0
    executions: set[int] = field(default_factory=set)
