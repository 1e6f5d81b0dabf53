"""``tideserve top``: a live terminal view of an endpoint (rich), from the gateway's admin
status and metrics. Rates and mean latency come from the difference of two samples."""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from tideserve.metrics.parse import sample_value


class Sampler:
    """Turns successive (status, metrics text) samples into a frame."""

    def __init__(self) -> None:
        self._prev: tuple[float, float, float, float] | None = None  # (t, requests, latency sum, latency count)

    def frame(self, status: dict, metrics: str, now: float) -> Group:
        req = sample_value(metrics, "tideserve_requests_total")
        lat_sum = sample_value(metrics, "tideserve_request_duration_seconds_sum")
        lat_n = sample_value(metrics, "tideserve_request_duration_seconds_count")
        rate = latency_ms = None
        if self._prev is not None and now > self._prev[0]:
            t0, r0, s0, n0 = self._prev
            rate = (req - r0) / (now - t0)
            latency_ms = 1000 * (lat_sum - s0) / (lat_n - n0) if lat_n > n0 else None
        self._prev = (now, req, lat_sum, lat_n)
        g = status["gateway"]
        head = Text.assemble(
            (f"{status['endpoint']}", "bold"), f"  model {status['model']}   ",
            f"requests/s {rate:.2f}   " if rate is not None else "requests/s -   ",
            f"mean latency {latency_ms:.0f} ms   " if latency_ms is not None else "mean latency -   ",
            f"in flight {g['in_flight']}   pending {g['pending']}   cost ${sample_value(metrics, 'tideserve_cost_usd_total'):.4f}",
        )
        t = Table("pool", "target", "state", "ready/desired", "replica", "replica state", "outstanding", "restarts", "uptime s")
        for p in status["pools"]:
            for i, r in enumerate(p["replicas"] or [None]):
                first = i == 0
                t.add_row(
                    p["name"] if first else "", p["target"] if first else "",
                    (p["state"] + (f" ({p['reason']})" if p["reason"] else "")) if first else "",
                    f"{p['ready']}/{p['desired']}" if first else "",
                    r["id"] if r else "-", r["state"] if r else "-", str(r.get("outstanding", 0)) if r else "-",
                    str(r["restarts"]) if r else "-", str(r["uptime_s"]) if r else "-",
                )
        parts: list[RenderableType] = [head, t]
        last = status.get("last_decision")
        if last:
            parts.append(Text(f"autoscaler: desired {dict(last['desired'])}: {last['reason']}"))
        return Group(*parts)


def run_top(fetch: Callable[[], tuple[dict, str]], interval_s: float, iterations: int, console) -> None:
    """Refresh every ``interval_s`` until Ctrl-C (``iterations`` > 0: stop after that many)."""
    from rich.live import Live

    sampler = Sampler()
    status, metrics = fetch()
    n = 1
    with Live(sampler.frame(status, metrics, time.monotonic()), console=console, refresh_per_second=4,
              auto_refresh=False) as live:
        try:
            while iterations <= 0 or n < iterations:
                time.sleep(interval_s)
                status, metrics = fetch()
                live.update(sampler.frame(status, metrics, time.monotonic()), refresh=True)
                n += 1
        except KeyboardInterrupt:
            pass
    if not console.is_terminal:
        console.line()  # Live leaves its last frame without a newline when the output is a pipe or file
