"""deploy/prometheus/rules.yaml through Prometheus' own promtool: the file checks, and a unit-test file
written here drives every alert from synthetic series — each fires just above its threshold and stays
quiet just below it (or, for durations, before its ``for`` has passed)."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from nibble.monitoring.rules import Thresholds, alerts

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "deploy" / "prometheus" / "rules.yaml"
PROMTOOL = shutil.which("promtool")
T = Thresholds()
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="no promtool (scripts/setup installs Debian's prometheus)")

TRAINER = {"instance": "trainer:9000", "job": "trainer"}
SAMPLER = {"instance": "sampler:9001", "job": "sampler"}


def series(name: str, labels: dict, values: str) -> dict:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return {"series": f"{name}{{{inner}}}", "values": values}


def trained(values: str = "0+100x80") -> list[dict]:
    """The trainer's instance, having trained tokens, and a sampler exporting the trainer gauges as zeros."""
    return [
        series("nibble_tokens_total", {**TRAINER, "role": "trainer"}, values),
        series("nibble_tokens_total", {**SAMPLER, "role": "sampler"}, values),
    ]


def expected(name: str, labels: dict, summary_labels: dict | None = None) -> list[dict]:
    alert = next(a for a in alerts(T) if a.name == name)
    summary = alert.summary
    for key, value in (summary_labels or {}).items():
        summary = summary.replace(f"{{{{ $labels.{key} }}}}", value)
    annotations = {"summary": summary, "runbook": f"README.md#{name.lower()}"}
    return [{"exp_labels": {**labels, "severity": alert.severity}, "exp_annotations": annotations}]


def case(name: str, inputs: list[dict], eval_time: str, fires: list[dict]) -> dict:
    return {
        "interval": "30s",
        "input_series": inputs,
        "alert_rule_test": [{"eval_time": eval_time, "alertname": name, "exp_alerts": fires}],
    }


def headroom(value: float, fires: bool) -> dict:
    inputs = [*trained(), series("nibble_drift_headroom", TRAINER, f"{value}x80"),
              series("nibble_drift_headroom", SAMPLER, "0x80")]  # fmt: skip
    found = expected("NibbleMismatchNearCritical", TRAINER) if fires else []
    return case("NibbleMismatchNearCritical", inputs, "10m", found)


def staleness(dropped_per_step: int, staleness_sum_per_step: int, fires: bool) -> dict:
    inputs = [
        series("nibble_stale_dropped_total", TRAINER, f"0+{dropped_per_step}x80"),
        series("nibble_staleness_steps_count", TRAINER, "0+100x80"),
        series("nibble_staleness_steps_sum", TRAINER, f"0+{staleness_sum_per_step}x80"),
    ]
    return case("NibbleStalenessHigh", inputs, "15m", expected("NibbleStalenessHigh", {}) if fires else [])


def idle(seconds_per_30s: int, fires: bool) -> dict:
    inputs = [series("nibble_trainer_idle_seconds_total", TRAINER, f"0+{seconds_per_30s}x80")]
    return case("NibbleTrainerStarved", inputs, "15m", expected("NibbleTrainerStarved", {}) if fires else [])


def grad_norm(spike: float, fires: bool) -> dict:
    # steps at norm 1, then one at `spike` held for two 30 s scrapes: fires when spike > 5 × the mean of
    # the 30-minute window (60 or 61 samples, two of them the spike): above 5.8
    inputs = [*trained("0+100x120"), series("nibble_grad_norm", TRAINER, f"1x99 {spike} {spike} 1x19")]
    return case("NibbleGradNormSpike", inputs, "50m30s", expected("NibbleGradNormSpike", TRAINER) if fires else [])


def sampler_down(eval_time: str, fires: bool, *, down_job: dict = SAMPLER) -> dict:
    # scraped for 5 minutes, then down (its series go stale)
    inputs = [
        series("up", SAMPLER, "1x10 0x30"),
        series("nibble_policy_version", {**SAMPLER, "role": "sampler"}, "3x10 _x30"),
        series("up", TRAINER, "1x10 0x30"),  # a trainer that stopped is not a sampler down
        series("nibble_policy_version", {**TRAINER, "role": "trainer"}, "3x10 _x30"),
    ]
    found = expected("NibbleSamplerDown", SAMPLER, SAMPLER) if fires else []
    return case("NibbleSamplerDown", inputs, eval_time, found)


def weight_sync(below_60s: int, fires: bool) -> dict:
    # 1000 syncs per 30 s, none under 30 s, `below_60s` of them under 60 s, the rest under 120 s
    buckets = {"30": "0x80", "60": f"0+{below_60s}x80", "120": "0+1000x80", "+Inf": "0+1000x80"}
    inputs = [series("nibble_weight_sync_seconds_bucket", {**SAMPLER, "le": le}, v) for le, v in buckets.items()]
    return case("NibbleWeightSyncSlow", inputs, "20m", expected("NibbleWeightSyncSlow", {}) if fires else [])


CASES = {
    "headroom just below the margin fires": headroom(T.headroom_margin - 0.0005, True),
    "headroom just above the margin is quiet": headroom(T.headroom_margin + 0.0005, False),
    "11% of trajectories dropped fires": staleness(12, 100, True),  # 12 / 112
    "9.9% dropped is quiet": staleness(11, 100, False),  # 11 / 111
    "mean staleness 2.1 fires": staleness(0, 210, True),
    "mean staleness 1.9 is quiet": staleness(0, 190, False),
    "trainer idle 53% fires": idle(16, True),
    "trainer idle 47% is quiet": idle(14, False),
    "grad norm 6.0 over steps at 1 fires": grad_norm(6.0, True),
    "grad norm 5.7 (under 5x the mean it raises) is quiet": grad_norm(5.7, False),
    "a sampler down for 3 minutes fires": sampler_down("8m", True),
    "a sampler down for 1.5 minutes is quiet": sampler_down("6m30s", False),
    "p90 sync 63 s fires": weight_sync(895, True),  # 60 + 60 · (0.9 − 0.895) / 0.105
    "p90 sync 59.8 s is quiet": weight_sync(905, False),  # 30 + 30 · 0.9 / 0.905
}


def test_promtool_checks_the_rules_file():
    result = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in yaml.safe_load(RULES.read_text())['groups'])} rules found" in (
        result.stdout
    )


def test_every_alert_is_driven_by_a_case_that_fires_and_one_that_does_not():
    fired = {c["alert_rule_test"][0]["alertname"] for c in CASES.values() if c["alert_rule_test"][0]["exp_alerts"]}
    quiet = {c["alert_rule_test"][0]["alertname"] for c in CASES.values() if not c["alert_rule_test"][0]["exp_alerts"]}
    assert fired == quiet == {a.name for a in alerts(T)}


def test_promtool_unit_tests_of_every_alert(tmp_path):
    shutil.copy(RULES, tmp_path / "rules.yaml")
    tests = {"rule_files": ["rules.yaml"], "evaluation_interval": "30s", "tests": list(CASES.values())}
    (tmp_path / "alerts_test.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    command = [PROMTOOL, "test", "rules", "alerts_test.yaml"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_default_headroom_margin_is_the_one_the_benchmark_recorded():
    record = json.loads((ROOT / "benchmarks" / "results" / "headroom_margin.json").read_text())
    assert record["margin"] == T.headroom_margin, "rerun benchmarks/headroom_margin.py, update HEADROOM_MARGIN"
