"""The dashboard's GPU panels against real GPU metrics: the /metrics text a torch-backend worker
served on the lent H200 (bench/results/h200_worker_metrics.txt, captured by
bench/gpu_session.sh) is served here on loopback, a real Prometheus scrapes it, and every GPU
panel query must return the values NVML reported there."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from endpoint import ROOT
from test_observability import running_prometheus

from tideserve.metrics.dashboard import build_dashboard, dashboard_exprs
from tideserve.metrics.panels import PANELS, resolve
from tideserve.metrics.parse import sample_value

CAPTURED = ROOT / "bench" / "results" / "h200_worker_metrics.txt"


@pytest.fixture(scope="module")
def prom_on_h200_metrics(tmp_path_factory):
    text = CAPTURED.read_bytes()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(text)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    tmp = tmp_path_factory.mktemp("gpu-panels")
    cfg = {"global": {"scrape_interval": "1s"},
           "scrape_configs": [{"job_name": "tideserve-workers",
                               "static_configs": [{"targets": [f"127.0.0.1:{server.server_port}"]}]}]}
    try:
        with running_prometheus(tmp, cfg) as prom:
            prom.wait(lambda: prom.query("nv_gpu_utilization"), "the captured GPU series")
            yield prom, text.decode()
    finally:
        server.shutdown()


def test_every_gpu_panel_query_returns_the_h200_values(prom_on_h200_metrics):
    prom, text = prom_on_h200_metrics
    gpu_titles = {p.title for p in PANELS if p.gpu}
    checked = 0
    for title, expr in dashboard_exprs(build_dashboard()):
        if title not in gpu_titles:
            continue
        result = prom.query(resolve(expr))  # All endpoints and pools
        assert result, f"GPU panel {title!r}: {expr} returned no data on the H200 metrics"
        for series in result:
            uuid = series["metric"]["gpu_uuid"]
            assert uuid.startswith("GPU-")
        checked += 1
    assert checked == sum(len(p.queries) for p in PANELS if p.gpu) >= 4
    uuid = prom.query("nv_gpu_memory_total_bytes")[0]["metric"]["gpu_uuid"]
    # The H200's memory as NVML reported it there, through the panel's own query.
    assert prom.value("sum by (gpu_uuid) (nv_gpu_memory_total_bytes)") == sample_value(
        text, "nv_gpu_memory_total_bytes", {"gpu_uuid": uuid}) == 150754820096.0
