"""Build the Grafana dashboard from ``panels.PANELS`` with grafana-foundation-sdk (the only
importer of that library). ``tideserve render dashboard`` writes it; the committed copy in
deploy/grafana/ is checked against this code by the tests."""

from __future__ import annotations

import json

from grafana_foundation_sdk.builders import dashboard as gdash
from grafana_foundation_sdk.builders import prometheus as gprom
from grafana_foundation_sdk.builders import timeseries as gts
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableOption, VariableRefresh

from tideserve.metrics.panels import PANELS

UID = "tideserve-endpoint"


def build_dashboard(default_datasource_uid: str | None = None) -> dict:
    """The dashboard as a JSON-ready dict: one time-series panel per ``PanelSpec``, and the
    template variables ``datasource`` (a Prometheus data source; ``default_datasource_uid``
    preselects one, else Grafana's default), ``endpoint`` and ``pool`` (multi-value, with All),
    which every query filters on (``panels.m``)."""
    ds = DataSourceRef(type_val="prometheus", uid="${datasource}")
    source = gdash.DatasourceVariable("datasource").label("Data source").type("prometheus")
    if default_datasource_uid is not None:
        source = source.current(VariableOption(selected=True, text=default_datasource_uid, value=default_datasource_uid))
    board = (
        gdash.Dashboard("tideserve endpoint")
        .uid(UID)
        .tags(["tideserve", "triton", "inference"])
        .description("Request rate, queue/compute latency split, GPU use, pending requests, load ratio, "
                     "replicas, cold starts and cost of tideserve endpoints.")
        .refresh("10s")
        .time("now-1h", "now")
        .with_variable(source)
        .with_variable(_label_variable("endpoint", "Endpoint", "label_values(tideserve_replicas, endpoint)", ds))
        .with_variable(_label_variable("pool", "Pool", 'label_values(tideserve_replicas{endpoint=~"$endpoint"}, pool)',
                                       ds))
    )
    for spec in PANELS:
        panel = (
            gts.Panel().title(spec.title).datasource(ds).unit(spec.unit).height(8).span(12)
        )
        if spec.description:
            panel = panel.description(spec.description)
        for j, q in enumerate(spec.queries):
            panel = panel.with_target(gprom.Dataquery().expr(q.expr).legend_format(q.legend).ref_id(chr(65 + j)))
        board = board.with_panel(panel)
    return json.loads(json.dumps(board.build(), cls=JSONEncoder))


def _label_variable(name: str, label: str, query: str, ds: DataSourceRef) -> gdash.QueryVariable:
    """A multi-value query variable over a label's values, All = every value (regex ``.*``)."""
    return (gdash.QueryVariable(name).label(label).query(query).datasource(ds).multi(True).include_all(True)
            .all_value(".*").refresh(VariableRefresh.ON_DASHBOARD_LOAD)
            .current(VariableOption(selected=True, text="All", value="$__all")))


def dashboard_exprs(board: dict) -> list[tuple[str, str]]:
    """(panel title, PromQL expression) of every query in a dashboard JSON."""
    return [(p["title"], t["expr"]) for p in board.get("panels", []) for t in p.get("targets", [])]
