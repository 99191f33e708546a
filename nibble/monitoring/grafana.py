"""The Grafana dashboard (``deploy/grafana/nibble.json``) built from :mod:`nibble.monitoring.panels` with
Grafana's own ``grafana-foundation-sdk`` (in the dev extra: only regenerating the JSON needs it).

``scripts/gen_monitoring`` writes the JSON; a test fails when the committed file differs from
:func:`dashboard_json`.
"""

from __future__ import annotations

import json

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import heatmap, prometheus, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    Threshold,
    ThresholdsMode,
    VariableRefresh,
    VariableSort,
)

from nibble.monitoring.panels import Panel, Row, rows
from nibble.monitoring.rules import HEADROOM_MARGIN

UID = "nibble-drift"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
WIDTH = 8  # three panels per row of Grafana's 24-column grid
HEIGHT = 8


def dashboard_json(headroom_margin: float = HEADROOM_MARGIN) -> str:
    """The dashboard as Grafana's JSON model (sorted keys, two-space indent, final newline)."""
    built = build(rows(headroom_margin)).build()
    return json.dumps(json.loads(JSONEncoder().encode(built)), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def build(dashboard_rows: tuple[Row, ...]) -> dash.Dashboard:
    """A dashboard builder: the datasource, ``role`` and ``pod`` variables, then one row per :class:`Row`."""
    board = (
        dash.Dashboard("Nibble: drift, staleness, throughput")
        .uid(UID)
        .tags(["nibble", "rl", "nvfp4"])
        .description("Asynchronous RL with NVFP4 rollouts: learning, drift, staleness, throughput, health.")
        .time("now-3h", "now")
        .refresh("30s")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .with_variable(dash.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
        .with_variable(_label_variable("role", "nibble_policy_version", "Role"))
        .with_variable(_label_variable("pod", 'nibble_policy_version{role=~"$role"}', "Pod"))
    )
    next_id = 1
    for row in dashboard_rows:
        board = board.with_row(dash.Row(row.title).id(next_id))
        next_id += 1
        for panel in row.panels:
            board = board.with_panel(_panel(panel, next_id))
            next_id += 1
    return board


def _label_variable(name: str, selector: str, label: str) -> dash.QueryVariable:
    """A multi-value variable over a label's values; All is ``.*`` so series without the label match too."""
    return (
        dash.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query({"query": f"label_values({selector}, {name})", "refId": f"{name}-values"})
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
    )


def _panel(spec: Panel, panel_id: int):
    builder = heatmap.Panel() if spec.kind == "heatmap" else timeseries.Panel()
    builder = (
        builder.id(panel_id)
        .title(spec.title)
        .description(spec.description)
        .datasource(DATASOURCE)
        .unit(spec.unit)
        .span(WIDTH)
        .height(HEIGHT)
    )
    for index, query in enumerate(spec.queries):
        target = prometheus.Dataquery().expr(query.expr).legend_format(query.legend).ref_id(chr(ord("A") + index))
        if spec.kind == "heatmap":
            target = target.format("heatmap")
        builder = builder.with_target(target)
    if spec.kind == "heatmap":
        return builder.calculate(False).show_tooltip().y_axis(heatmap.YAxisConfig().unit(spec.unit))
    legend = common_builders.VizLegendOptions().show_legend(True).display_mode("list").placement("bottom")
    builder = builder.legend(legend)
    if spec.lines:
        builder = builder.thresholds(_thresholds(spec)).thresholds_style(
            common_builders.GraphThresholdsStyleConfig().mode(common.GraphTresholdsStyleMode.LINE)
        )
    return builder


def _thresholds(spec: Panel) -> dash.ThresholdsConfig:
    """Grafana colours a value by the highest step at or below it: below the first line the first line's
    colour, then each next line's, green above the last (headroom: red below 0, orange up to the margin)."""
    lines = sorted(spec.lines, key=lambda line: line.value)
    colors = [line.color for line in lines[1:]] + ["green"]
    steps = [Threshold(value=None, color=lines[0].color)]
    steps += [Threshold(value=line.value, color=color) for line, color in zip(lines, colors, strict=True)]
    return dash.ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(steps)
