"""Build the Grafana dashboard from ``panels.PANELS`` with grafana-foundation-sdk (the only
importer of that library). ``tideserve render dashboard`` writes it; the committed copy in
deploy/grafana/ is checked against this code by the tests."""

from __future__ import annotations

import json

from grafana_foundation_sdk.builders import dashboard as gdash
from grafana_foundation_sdk.builders import prometheus as gprom
from grafana_foundation_sdk.builders import timeseries as gts
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef

from tideserve.metrics.panels import PANELS

UID = "tideserve-endpoint"


def build_dashboard(datasource_uid: str = "${DS_PROMETHEUS}") -> dict:
    """The dashboard as a JSON-ready dict: one time-series panel per ``PanelSpec``."""
    ds = DataSourceRef(type_val="prometheus", uid=datasource_uid)
    board = (
        gdash.Dashboard("tideserve endpoint")
        .uid(UID)
        .tags(["tideserve", "triton", "inference"])
        .description("Request rate, queue/compute latency split, GPU use, pending requests, load ratio, "
                     "replicas, cold starts and cost of tideserve endpoints.")
        .refresh("10s")
        .time("now-1h", "now")
    )
    for _i, spec in enumerate(PANELS):
        panel = (
            gts.Panel().title(spec.title).datasource(ds).unit(spec.unit).height(8).span(12)
        )
        if spec.description:
            panel = panel.description(spec.description)
        for j, q in enumerate(spec.queries):
            panel = panel.with_target(gprom.Dataquery().expr(q.expr).legend_format(q.legend).ref_id(chr(65 + j)))
        board = board.with_panel(panel)
    out = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    if datasource_uid == "${DS_PROMETHEUS}":
        # Grafana's import form asks for the data source that ${DS_PROMETHEUS} stands for.
        out["__inputs"] = [{"name": "DS_PROMETHEUS", "label": "Prometheus", "description": "",
                            "type": "datasource", "pluginId": "prometheus", "pluginName": "Prometheus"}]
    return out


def dashboard_exprs(board: dict) -> list[tuple[str, str]]:
    """(panel title, PromQL expression) of every query in a dashboard JSON."""
    return [(p["title"], t["expr"]) for p in board.get("panels", []) for t in p.get("targets", [])]
