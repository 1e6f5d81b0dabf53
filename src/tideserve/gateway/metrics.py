"""Gateway metrics (``tideserve_`` prefix). Labels hold only bounded values: endpoint and
pool names from the spec, status codes, replica states; never paths, request ids or
client-chosen model names."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily

from tideserve.metrics.triton import LATENCY_BUCKETS_S


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "tideserve_requests", "Requests answered by the gateway", ["endpoint", "pool", "api", "code"], registry=r
        )
        self.latency = Histogram(
            "tideserve_request_duration_seconds", "End-to-end request latency at the gateway (s)", ["endpoint", "api"],
            buckets=LATENCY_BUCKETS_S, registry=r,
        )
        self.hold = Histogram(
            "tideserve_hold_duration_seconds", "Time a request waited for a replica slot (s)", ["endpoint"],
            buckets=(0.001, 0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120), registry=r,
        )
        self.pending = Gauge("tideserve_pending_requests", "Requests held waiting for a replica slot", ["endpoint"], registry=r)
        self.in_flight = Gauge("tideserve_in_flight_requests", "Requests being served by replicas", ["endpoint"], registry=r)
        self.replicas = Gauge("tideserve_replicas", "Replicas by pool and state", ["endpoint", "pool", "state"], registry=r)
        self.routed = Counter("tideserve_routing_decisions", "Requests routed, by pool", ["endpoint", "pool"], registry=r)
        self.retries = Counter(
            "tideserve_retries", "Requests re-sent to another replica after one failed", ["endpoint", "pool"], registry=r
        )
        # Load ratio = request time / compute time (Triton's dashboards define it so): a ratio
        # near 1 means requests are computing, a growing one that they wait.
        self.request_seconds = Counter(
            "tideserve_request_seconds", "Gateway time of answered inference requests (s)", ["endpoint", "pool"], registry=r
        )
        self.compute_seconds = Counter(
            "tideserve_compute_seconds", "Model execution time of answered inference requests (s)",
            ["endpoint", "pool"], registry=r,
        )
        self.cold_starts = Counter(
            "tideserve_cold_starts", "Replicas started (process start to ready)", ["endpoint", "pool"], registry=r
        )
        self.cold_start_phase = Histogram(
            "tideserve_cold_start_phase_seconds", "Duration of each cold-start phase of a replica (s)",
            ["endpoint", "pool", "phase"], buckets=(0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
            registry=r,
        )
        self.pool_state = Gauge(
            "tideserve_pool_state", "1 for the current state of each pool (running, failed, unschedulable)",
            ["endpoint", "pool", "state"], registry=r,
        )

    def exposition(self) -> bytes:
        """Every gateway metric in the Prometheus text format 0.0.4 (UTF-8 bytes), for /metrics."""
        return generate_latest(self.registry)

    def observe_cold_start(self, endpoint: str, pool: str, phases: dict) -> None:
        """Record a replica that became ready, with its phases (``*_s`` keys, seconds)."""
        self.cold_starts.labels(endpoint, pool).inc()
        for key, value in phases.items():
            if key.endswith("_s") and isinstance(value, (int, float)) and value >= 0:
                self.cold_start_phase.labels(endpoint, pool, key.removesuffix("_s")).observe(value)

    def register_cost(self, endpoint: str, pools: Callable[[], Iterable[tuple[str, float, float]]]) -> None:
        """Export ``tideserve_cost_usd_total{endpoint,pool}`` = cost_usd_per_h x replica time,
        computed at each scrape from ``pools()`` -> (pool, cost_usd_per_h, replica seconds)."""

        class _Cost:
            def collect(self):
                fam = CounterMetricFamily(
                    "tideserve_cost_usd", "Cost so far: cost_usd_per_h x replica time", labels=["endpoint", "pool"]
                )
                for pool, usd_per_h, seconds in pools():
                    fam.add_metric([endpoint, pool], usd_per_h * seconds / 3600.0)
                yield fam

        self.registry.register(_Cost())
