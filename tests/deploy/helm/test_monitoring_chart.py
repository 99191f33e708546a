"""The chart's monitoring objects: the Grafana dashboard ConfigMap for Grafana's sidecar and the
PrometheusRule for the Prometheus operator carry exactly deploy/grafana/nibble.json and
deploy/prometheus/rules.yaml, and are off by default."""

import json
import shutil
import subprocess

import pytest
import yaml

from tests.deploy.helm.kubernetes_models import problems
from tests.deploy.helm.nibble_chart import NAMESPACE, ROOT, render

ON = ("monitoring.grafanaDashboard.enabled=true", "monitoring.prometheusRule.enabled=true")


def by_kind(objects, kind: str, component: str) -> list[dict]:
    return [
        o for o in objects if o["kind"] == kind and o["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]


def test_monitoring_objects_are_off_by_default():
    objects = render()
    assert not by_kind(objects, "ConfigMap", "dashboard") and not by_kind(objects, "PrometheusRule", "rules")


def test_the_dashboard_configmap_holds_the_committed_dashboard_for_grafanas_sidecar():
    (configmap,) = by_kind(render(*ON), "ConfigMap", "dashboard")
    assert problems(configmap) == []
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["namespace"] == NAMESPACE
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "nibble.json").read_text())
    assert json.loads(configmap["data"]["nibble.json"]) == dashboard


def test_the_prometheus_rule_holds_the_committed_rules(tmp_path):
    (rule,) = by_kind(render(*ON, "monitoring.prometheusRule.labels.release=kps"), "PrometheusRule", "rules")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["metadata"]["labels"]["release"] == "kps"
    assert rule["spec"] == yaml.safe_load((ROOT / "deploy" / "prometheus" / "rules.yaml").read_text())
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("no promtool (scripts/setup installs Debian's prometheus)")
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(rule["spec"]))
    result = subprocess.run([promtool, "check", "rules", str(tmp_path / "spec.yaml")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
