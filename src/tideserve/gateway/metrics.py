"""Gateway metrics (``tideserve_`` prefix). Labels hold only bounded values: endpoint and
pool names from the spec, status codes, replica states; never paths, request ids or
client-chosen model names."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

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
