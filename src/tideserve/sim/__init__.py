"""Discrete-event replay of request traces through tideserve's own routing, holding, batching,
autoscaling and provisioning code on a virtual clock, and the cost/TCO report.

Imports no runtime, Kubernetes applier or HTTP server (an import-linter contract checks it).
"""

from tideserve.sim.coldstart import ColdStartCatalog
from tideserve.sim.compare import Lever, PolicyRun, Summary, compare, summarize
from tideserve.sim.engine import POLICY, RequestOutcome, RunOptions, RunResult, Simulation, percentile, simulate
from tideserve.sim.errors import SimInputError
from tideserve.sim.profile import PoolProfile, Profile, ProfilePoint, load_profile
from tideserve.sim.trace import DEFAULT_DURATION_RULE, DurationRule, TraceRequest, load_trace

__all__ = [
    "DEFAULT_DURATION_RULE", "POLICY", "ColdStartCatalog", "DurationRule", "Lever", "PolicyRun", "PoolProfile",
    "Profile", "ProfilePoint", "RequestOutcome", "RunOptions", "RunResult", "SimInputError", "Simulation",
    "Summary", "TraceRequest", "compare", "load_profile", "load_trace", "percentile", "simulate", "summarize",
]
