"""The committed Grafana dashboard: current with its code, a valid Grafana dashboard model, and every
panel's metrics exported by Nibble's services (the end-to-end proof against a real Prometheus is in
tests/launcher/test_run_smoke.py)."""

import json
import re
from pathlib import Path

import pytest
from grafana_foundation_sdk.models.dashboard import Dashboard
from prometheus_client import generate_latest

from nibble.monitoring.grafana import dashboard_json
from nibble.monitoring.metrics import ROLES, Metrics
from nibble.monitoring.panels import promql, rows
from nibble.monitoring.rules import HEADROOM_MARGIN, RECORDING_RULES, rules_yaml

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy" / "grafana" / "nibble.json"
RULES = ROOT / "deploy" / "prometheus" / "rules.yaml"
PROMQL_KEYWORDS = {"and", "or", "unless", "offset", "bool", "inf", "nan"}
GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")


def test_committed_dashboard_and_rules_are_what_the_code_generates():
    stale = [p.name for p, text in ((DASHBOARD, dashboard_json()), (RULES, rules_yaml())) if p.read_text() != text]
    assert not stale, f"{stale} differ from nibble/monitoring: run scripts/gen_monitoring and commit the result"


def panels(board: dict) -> list[dict]:
    return [p for p in board["panels"] if p["type"] != "row"]


def test_the_dashboard_loads_as_a_grafana_dashboard_model():
    raw = json.loads(DASHBOARD.read_text())
    model = Dashboard.from_json(raw)  # Grafana's own schema types (grafana-foundation-sdk)
    assert model.schema_version >= 36 and model.uid == raw["uid"]
    ids = [p["id"] for p in raw["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    variables = {v["name"]: v for v in raw["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("role", "pod"):
        assert variables[name]["type"] == "query" and variables[name]["includeAll"], name
    rows_titles = [p["title"] for p in raw["panels"] if p["type"] == "row"]
    assert rows_titles == ["Learning", "Drift", "Staleness", "Throughput", "Health"]
    for panel in panels(raw):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{panel['title']} has no unit"
        assert panel["targets"] and all(t["expr"] for t in panel["targets"]), panel["title"]
        assert panel["gridPos"]["w"] > 0 and panel["gridPos"]["h"] > 0, panel["title"]
    headroom = next(p for p in panels(raw) if p["title"] == "Drift headroom")
    steps = headroom["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["value"] for s in steps] == [None, 0.0, HEADROOM_MARGIN]  # the critical line and the alert margin


def exported_names() -> set[str]:
    """Every sample name any service's /metrics page carries at start-up."""
    names = set()
    for role in ROLES:
        for line in generate_latest(Metrics(role).registry).decode().splitlines():
            if line and not line.startswith("#"):
                names.add(re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group())
    return names


def metric_names(expr: str) -> set[str]:
    """Metric (or recorded series) names in a PromQL expression: identifiers left once label matchers,
    strings, ranges and grouping clauses are removed, except function calls and keywords."""
    bare = GROUPING.sub(" ", re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"", " ", expr))
    words = re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", bare)
    return {w for w in words if w.lower() not in PROMQL_KEYWORDS}


@pytest.mark.parametrize("panel", [p for row in rows(HEADROOM_MARGIN) for p in row.panels], ids=lambda p: p.title)
def test_every_panel_reads_only_metrics_a_service_exports(panel):
    exported = exported_names()
    for query in panel.queries:
        names = metric_names(promql(query.expr))
        assert names, query.expr
        for name in names:
            sources = metric_names(RECORDING_RULES[name]) if name in RECORDING_RULES else {name}
            missing = sources - exported
            assert not missing, f"panel {panel.title!r}: {missing} exported by no service ({query.expr})"


def test_metric_names_finds_what_a_query_reads():
    # the check above is only as good as this parser
    assert metric_names('sum by (le) (rate(nibble_x_bucket{pod=~"$pod"}[2m])) and on(instance) up') == {
        "nibble_x_bucket", "up"
    }  # fmt: skip
    assert metric_names("role:nibble_tokens:rate2m > 0") == {"role:nibble_tokens:rate2m"}
    assert "nibble_made_up_total" in metric_names("nibble_made_up_total and on(instance) nibble_policy_version")
