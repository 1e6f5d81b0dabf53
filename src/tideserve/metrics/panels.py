"""The dashboard's panels and the alerting rules, as data: one source for the generated
Grafana dashboard (``metrics/dashboard.py``), the Prometheus rules, and the tests that run
every query against a real Prometheus.

Queries use Triton's worker metrics (``nv_*``, summed over replicas, which Prometheus finds
through the gateway's HTTP service discovery) and the gateway's ``tideserve_*`` metrics.
Durations in Triton's metrics are cumulative microseconds; rates of them over rates of counts
give mean durations (Triton's own dashboards compute them so).
"""

from __future__ import annotations

from dataclasses import dataclass

W = "1m"  # rate window: 4 scrapes at Prometheus' default 15 s interval

#: The dashboard's template variables (Grafana substitutes them; ``resolve`` does it for tests).
#: Multi-value and "All" selections expand to a regex, hence ``=~``.
VARIABLES = ("endpoint", "pool")
_EP = 'endpoint=~"$endpoint"'
_EP_POOL = 'endpoint=~"$endpoint", pool=~"$pool"'


def m(name: str, pool: bool = True) -> str:
    """Metric ``name`` filtered by the dashboard's variables: endpoint, and pool when the
    series carry a pool label (every worker series, through its scrape target's labels; the
    gateway's per-pool series). Series of the gateway without a pool label are filtered by
    endpoint only."""
    return f"{name}{{{_EP_POOL if pool else _EP}}}"


def resolve(expr: str, endpoint: str = ".*", pool: str = ".*") -> str:
    """``expr`` with the variables replaced as Grafana does for one value (default: All)."""
    return expr.replace("$endpoint", endpoint).replace("$pool", pool)


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class PanelSpec:
    title: str
    queries: tuple[Query, ...]
    unit: str = "short"
    description: str = ""
    gpu: bool = False  # needs a GPU to return data


def _mean_us_to_ms(num: str, den: str) -> str:
    return f"sum(rate({m(num)}[{W}])) / sum(rate({m(den)}[{W}])) / 1000"


PANELS: tuple[PanelSpec, ...] = (
    PanelSpec("Request rate: success / failure", (
        Query(f"sum(rate({m('nv_inference_request_success')}[{W}]))", "success"),
        Query(f"sum by (reason) (rate({m('nv_inference_request_failure')}[{W}]))", "failure {{reason}}"),
        Query(f"sum by (code) (rate({m('tideserve_requests_total')}[{W}]))", "gateway {{code}}"),
    ), unit="reqps"),
    PanelSpec("Average latency: total / queue / compute", (
        Query(_mean_us_to_ms("nv_inference_request_duration_us", "nv_inference_request_success"), "total per request"),
        Query(_mean_us_to_ms("nv_inference_queue_duration_us", "nv_inference_count"), "queue per window"),
        Query(_mean_us_to_ms("nv_inference_compute_infer_duration_us", "nv_inference_count"), "compute per window"),
    ), unit="ms"),
    PanelSpec("Compute breakdown: input / infer / output", (
        Query(_mean_us_to_ms("nv_inference_compute_input_duration_us", "nv_inference_count"), "input (features)"),
        Query(_mean_us_to_ms("nv_inference_compute_infer_duration_us", "nv_inference_count"), "infer (encode+decode)"),
        Query(_mean_us_to_ms("nv_inference_compute_output_duration_us", "nv_inference_count"), "output (text)"),
    ), unit="ms"),
    PanelSpec("Inference and execution throughput", (
        Query(f"sum(rate({m('nv_inference_count')}[{W}]))", "inferences (windows)/s"),
        Query(f"sum(rate({m('nv_inference_exec_count')}[{W}]))", "executions (batches)/s"),
    ), unit="ops", description="Executions below inferences means batching is working."),
    PanelSpec("GPU utilization", (Query(f"avg by (gpu_uuid) ({m('nv_gpu_utilization')})", "{{gpu_uuid}}"),),
              unit="percentunit", gpu=True),
    PanelSpec("GPU memory used", (
        Query(f"sum by (gpu_uuid) ({m('nv_gpu_memory_used_bytes')})", "used {{gpu_uuid}}"),
        Query(f"sum by (gpu_uuid) ({m('nv_gpu_memory_total_bytes')})", "total {{gpu_uuid}}"),
    ), unit="bytes", gpu=True),
    PanelSpec("GPU power", (Query(f"sum by (gpu_uuid) ({m('nv_gpu_power_usage')})", "{{gpu_uuid}}"),), unit="watt", gpu=True),
    PanelSpec("Pending requests", (
        Query(f"sum({m('tideserve_pending_requests', pool=False)})", "held at the gateway"),
        Query(f"sum({m('nv_inference_pending_request_count')})", "windows queued in workers"),
        Query(f"sum({m('tideserve_in_flight_requests', pool=False)})", "in flight"),
    )),
    PanelSpec("Queue time", (
        Query(f"histogram_quantile(0.99, sum by (le) (rate({m('tideserve_hold_duration_seconds_bucket', pool=False)}[{W}])))",
              "p99 hold at gateway"),
        Query(_mean_us_to_ms("nv_inference_queue_duration_us", "nv_inference_count") + " / 1000",
              "mean worker queue"),
    ), unit="s"),
    PanelSpec("Load ratio (total time / compute time)", (
        Query(f"sum(rate({m('tideserve_request_seconds_total')}[{W}])) / sum(rate({m('tideserve_compute_seconds_total')}[{W}]))",
              "gateway"),
        Query(f"sum(rate({m('nv_inference_request_duration_us')}[{W}])) / sum(rate({m('nv_inference_compute_infer_duration_us')}[{W}]))",
              "workers"),
    ), description="Near 1: requests spend their time computing. Growing: they wait; add capacity."),
    PanelSpec("Replicas by pool", (Query(f"sum by (pool, state) ({m('tideserve_replicas')})", "{{pool}} {{state}}"),)),
    PanelSpec("Cold starts", (
        Query(f"sum by (pool) (increase({m('tideserve_cold_starts_total')}[1h]))", "starts/h {{pool}}"),
        Query(f"sum by (phase) ({m('tideserve_cold_start_phase_seconds_sum')}) / "
              f"sum by (phase) ({m('tideserve_cold_start_phase_seconds_count')})",
              "mean {{phase}} (s)"),
    )),
    PanelSpec("Cost", (
        Query(f"sum by (pool) ({m('tideserve_cost_usd_total')})", "so far {{pool}} ($)"),
        Query(f"sum by (pool) (rate({m('tideserve_cost_usd_total')}[{W}])) * 3600", "rate {{pool}} ($/h)"),
    ), unit="currencyUSD"),
)


@dataclass(frozen=True)
class AlertSpec:
    name: str
    expr: str
    for_: str
    severity: str
    summary: str


ALERTS: tuple[AlertSpec, ...] = (
    AlertSpec(
        "TideserveQueueGrowing",
        "deriv(sum(tideserve_pending_requests)[5m:30s]) > 0 and sum(tideserve_pending_requests) > 10",
        "5m", "warning",
        "Requests held at the gateway have grown for 5 minutes: arrivals outpace capacity; raise max replicas.",
    ),
    AlertSpec(
        "TideserveHighErrorRatio",
        'sum(rate(tideserve_requests_total{code=~"5.."}[5m])) / sum(rate(tideserve_requests_total[5m])) > 0.05',
        "5m", "critical",
        "More than 5% of requests fail with a server error.",
    ),
    AlertSpec(
        "TideserveReplicasNotReady",
        'sum by (endpoint, pool) (tideserve_replicas{state=~"starting|restarting"}) > 0',
        "10m", "warning",
        "Replicas of {{ $labels.pool }} have not become ready for 10 minutes.",
    ),
    AlertSpec(
        "TideservePoolDown",
        'max by (endpoint, pool, state) (tideserve_pool_state{state=~"failed|unschedulable"}) == 1',
        "1m", "critical",
        "Pool {{ $labels.pool }} is {{ $labels.state }}; `tideserve status` gives the reason.",
    ),
)


def alert_rules() -> dict:
    """The alerting rules as a Prometheus rule file (dict, dump as YAML)."""
    return {"groups": [{"name": "tideserve", "rules": [
        {"alert": a.name, "expr": a.expr, "for": a.for_, "labels": {"severity": a.severity},
         "annotations": {"summary": a.summary}}
        for a in ALERTS
    ]}]}
