"""Metrics through a real Prometheus: every dashboard query returns data, counters equal the
traffic sent, the alerting rules load. Prometheus (Debian package) is installed by `make test`."""

from __future__ import annotations

import base64
import contextlib
import json
import math
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from endpoint import ROOT, EndpointProcess, write_endpoint

from tideserve.metrics.dashboard import build_dashboard, dashboard_exprs
from tideserve.metrics.panels import PANELS, alert_rules, resolve

N_GOOD = 6
DASHBOARD = ROOT / "deploy" / "grafana" / "tideserve-dashboard.json"
ALERTS = ROOT / "deploy" / "prometheus" / "tideserve-alerts.yaml"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expr: str) -> list:
        r = httpx.get(self.url + "/api/v1/query", params={"query": expr}, timeout=10)
        body = r.json()
        assert body["status"] == "success", (expr, body)
        return body["data"]["result"]

    def value(self, expr: str) -> float:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else math.nan

    def wait(self, pred, what: str, timeout_s: float = 90):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got = pred()
            if got:
                return got
            time.sleep(0.5)
        raise AssertionError(f"Prometheus never showed {what}")


@contextlib.contextmanager
def running_prometheus(tmp: Path, cfg: dict):
    """A real Prometheus (Debian's package) on a free loopback port with config ``cfg``, ready;
    yields a Prometheus client and stops the server after."""
    prom_bin = shutil.which("prometheus")
    assert prom_bin, "prometheus is not installed: `make test` installs Debian's prometheus package"
    port = _free_port()
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    with open(tmp / "prometheus.log", "wb") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen([prom_bin, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        prom = Prometheus(f"http://127.0.0.1:{port}")
        prom.wait(lambda: _ready(prom.url), "ready", 60)
        yield prom
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.fixture(scope="module")
def observed(tmp_path_factory, en_clips):
    """An endpoint scraped by a real Prometheus (1 s interval), with known traffic sent."""
    tmp = tmp_path_factory.mktemp("observed")
    path = write_endpoint(tmp)
    with EndpointProcess(path, tmp) as ep:
        gw = f"127.0.0.1:{ep.port}"
        cfg = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(ALERTS)],
            "scrape_configs": [
                {"job_name": "tideserve-gateway", "static_configs": [{"targets": [gw]}]},
                {"job_name": "tideserve-workers",
                 "http_sd_configs": [{"url": f"http://{gw}/admin/sd", "refresh_interval": "1s"}],
                 # workers answer /metrics only with their token (as a Bearer credential)
                 "authorization": {"credentials_file": str(ep.worker_token_file)}},
            ],
        }
        with running_prometheus(tmp, cfg) as prom:
            prom.wait(lambda: len(prom.query('up{job="tideserve-workers"} == 1')) == 1, "the worker target up")
            sent = _traffic(ep, en_clips)
            prom.wait(lambda: prom.value("sum(nv_inference_request_success)") == N_GOOD
                      and prom.value("sum(tideserve_requests_total)") == sum(sent.values()), "all the traffic")
            yield ep, prom, sent


def _ready(url: str) -> bool:
    try:
        return httpx.get(url + "/-/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _traffic(ep: EndpointProcess, clips) -> dict[str, int]:
    """N_GOOD good requests and one or more of each kind of failure; returns counts by status."""
    sent: dict[str, int] = {}
    with ep.client() as c:
        def post(path, **kw):
            r = c.post(path, **kw)
            sent[str(r.status_code)] = sent.get(str(r.status_code), 0) + 1
            return r

        for i in range(N_GOOD):
            assert post("/invocations", json={"audio_data": base64.b64encode(clips[i % len(clips)].wav).decode()}).status_code == 200
        assert post("/invocations", content=b"{nope", headers={"Content-Type": "application/json"}).status_code == 400
        assert post("/invocations", json={"audio_data": base64.b64encode(b"RIFF" + b"\0" * 40).decode()}).status_code == 400
        assert post("/invocations", json={"audio_data": base64.b64encode(b"\xff\xfb" + bytes(200)).decode()}).status_code == 400
        assert post("/v2/models/other/infer", json={"inputs": []}).status_code == 404
        assert post("/invocations", content=b"x" * (30 * 1024 * 1024), headers={"Content-Type": "application/json"}).status_code == 413
    return sent


def test_every_dashboard_query_returns_data(observed):
    ep, prom, _ = observed
    board = build_dashboard()
    gpu_titles = {p.title for p in PANELS if p.gpu}
    name = yaml.safe_load(ep.file.read_text())["metadata"]["name"]
    pools = {r["metric"]["pool"] for r in prom.query(f'tideserve_replicas{{endpoint="{name}"}}')}
    assert pools == {"cpu"}  # what the pool variable's query lists for this endpoint
    checked = 0
    for title, expr in dashboard_exprs(board):
        if title in gpu_titles:
            continue
        assert prom.query(resolve(expr, endpoint=name, pool="cpu")), f"panel {title!r}: {expr} returned no data"
        assert prom.query(resolve(expr)), f"panel {title!r}: {expr} returned no data with All selected"
        # Every query is filtered by the variables: another endpoint's or pool's view is empty.
        assert prom.query(resolve(expr, endpoint="no-such-endpoint")) in ([], [{"metric": {}, "value": [None, "NaN"]}]), title
        checked += 1
    assert checked == sum(len(p.queries) for p in PANELS if not p.gpu)


def test_dashboard_variables_and_the_configmap_agree_with_the_file():
    board = build_dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert list(variables) == ["datasource", "endpoint", "pool"]
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["pool"]["query"] == 'label_values(tideserve_replicas{endpoint=~"$endpoint"}, pool)'
    assert all(v["multi"] and v["includeAll"] and v["allValue"] == ".*" for n, v in variables.items() if n != "datasource")
    assert {json.dumps(p["datasource"]) for p in board["panels"]} == {'{"type": "prometheus", "uid": "${datasource}"}'}
    assert all('endpoint=~"$endpoint"' in expr for _, expr in dashboard_exprs(board))
    from tideserve.k8s.cluster import ClusterConfig, dashboard_config_map

    doc = yaml.safe_load((ROOT / "examples" / "cluster.yaml").read_text())
    config = ClusterConfig.model_validate({**doc, "grafana_datasource_uid": "prom-main"})
    shipped = json.loads(dashboard_config_map(config)["data"]["tideserve-dashboard.json"])
    file = json.loads(DASHBOARD.read_text())
    assert shipped["panels"] == file["panels"]  # the same data source variable in every panel
    assert shipped["templating"]["list"][0]["current"]["value"] == "prom-main"  # preselected on the cluster
    assert "current" not in file["templating"]["list"][0]  # Grafana's default data source


def test_counters_equal_the_traffic(observed):
    _, prom, sent = observed
    assert prom.value("sum(nv_inference_request_success)") == N_GOOD
    by_code = {r["metric"]["code"]: float(r["value"][1]) for r in prom.query("sum by (code) (tideserve_requests_total)")}
    assert by_code == {k: float(v) for k, v in sent.items()}
    assert by_code == {"200": N_GOOD, "400": 3, "404": 1, "413": 1}
    # All three 400s reached the worker's request path (bodies are parsed there, in a prep process):
    # the malformed JSON and the two files that are not audio are REJECTED there.
    assert prom.value('sum(nv_inference_request_failure{reason="REJECTED"})') == 3
    assert prom.value("sum(nv_inference_count)") == N_GOOD
    assert prom.value("sum(nv_inference_exec_count)") <= N_GOOD
    # The gateway forwards bodies unparsed: the malformed JSON was routed too (the worker said 400).
    assert prom.value("sum(tideserve_routing_decisions_total)") == N_GOOD + 3
    assert prom.value("sum(nv_inference_pending_request_count)") == 0


def test_gpu_series_are_absent_without_a_gpu(observed):
    ep, prom, _ = observed
    assert "nv_gpu_" not in ep.worker_metrics()
    assert prom.query("nv_gpu_utilization") == []


def test_alerting_rules_load_and_pass_promtool(observed):
    _, prom, _ = observed
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed: `make test` installs Debian's prometheus package"
    check = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    rules = prom.wait(lambda: [r for g in httpx.get(prom.url + "/api/v1/rules", timeout=10).json()["data"]["groups"]
                               for r in g["rules"] if r.get("health") == "ok"], "evaluated rules")
    assert {r["name"] for r in rules} == {r["alert"] for r in alert_rules()["groups"][0]["rules"]}


#: The placeholder for the workers' token file in the shipped Prometheus configuration.
TOKEN_FILE_PLACEHOLDER = "/home/USER/.cache/tideserve/worker-token"


def test_shipped_prometheus_config_is_valid(tmp_path):
    """promtool accepts the shipped file once its token-file placeholder names a real file (it
    checks that the file exists), and the worker job sends that token."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed: `make test` installs Debian's prometheus package"
    text = (ALERTS.parent / "prometheus.yml").read_text()
    workers = {j["job_name"]: j for j in yaml.safe_load(text)["scrape_configs"]}["tideserve-workers"]
    assert workers["authorization"] == {"credentials_file": TOKEN_FILE_PLACEHOLDER}
    (tmp_path / "worker-token").write_text("t\n")
    shutil.copy(ALERTS, tmp_path / ALERTS.name)
    (tmp_path / "prometheus.yml").write_text(text.replace(TOKEN_FILE_PLACEHOLDER, str(tmp_path / "worker-token")))
    check = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_committed_dashboard_and_rules_are_generated_from_code():
    assert json.loads(DASHBOARD.read_text()) == build_dashboard()
    assert yaml.safe_load(ALERTS.read_text()) == alert_rules()


def test_request_log_line_is_structured(observed):
    ep, _, _ = observed
    lines = [json.loads(line) for line in ep.log_path.read_text().splitlines() if line.startswith("{")]
    requests = [x for x in lines if x.get("msg") == "request" and x.get("component") == "gateway"]
    ok = [x for x in requests if x["status"] == 200]
    assert len(ok) == N_GOOD
    for x in ok:
        assert x["request_id"] and x["endpoint"] == "whisper" and x["pool"] == "cpu" and x["replica"] == "cpu-0"
        assert x["duration_ms"] > 0 and x["hold_ms"] >= 0
    worker_lines = [x for x in lines if x.get("component") == "worker" and x.get("msg") == "transcribed"]
    assert {x["request_id"] for x in worker_lines} == {x["request_id"] for x in ok}
    # Each error's reason is logged with its status (found by a new user's try: the status alone).
    failed = [x for x in requests if x["status"] != 200]
    assert sorted(x["status"] for x in failed) == [400, 400, 400, 404, 413]
    assert all(x.get("error") for x in failed), failed
    assert any("not valid JSON" in x["error"] for x in failed if x["status"] == 400), [x["error"] for x in failed]
    assert "other" in next(x["error"] for x in failed if x["status"] == 404)
    assert all("error" not in x for x in ok)


def test_top_shows_pools_rate_and_pending(observed):
    ep, _, _ = observed
    r = subprocess.run([sys.executable, "-m", "tideserve", "top", "--url", ep.url, "--iterations", "2", "--interval", "0.3"],
                       capture_output=True, text=True, timeout=60, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    assert "cpu-0" in r.stdout and "requests/s" in r.stdout and "pending 0" in r.stdout
