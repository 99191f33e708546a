"""``nibble run --prometheus`` end to end on configs/smoke.yaml: real processes, a real redis-server, real
gRPC, and a real Prometheus scraping every service with the alert and recording rules — then every
dashboard panel's query and every recording rule is evaluated against what it stored, and ``nibble report
run`` renders the main panels from it."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from nibble.monitoring.metrics import Metrics
from nibble.monitoring.panels import rows
from nibble.monitoring.report import main_panels, tsdb_reader
from nibble.monitoring.rules import HEADROOM_MARGIN, RECORDING_RULES
from tests.helpers import DESIGN_METRICS
from tests.services import PROMETHEUS, free_port, run_launcher

ROOT = Path(__file__).resolve().parents[2]
NIBBLE = str(Path(sys.executable).with_name("nibble"))
SUMMARY_KEYS = {
    "steps",
    "initial_reward",
    "final_reward",
    "eval_accuracy_before",
    "eval_accuracy_after",
    "wall_seconds",
    "sampler_tokens_per_second",
    "trainer_tokens_per_second",
    "mean_staleness",
    "stale_dropped",
    "dead_lettered",
    "mismatch_kl_mean",
    "logprob_abs_diff_mean",
    "is_clipped_fraction_mean",
    "weight_versions_published",
    "config",
}


@pytest.fixture(scope="module")
def smoke_run(warm_start, tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke") / "run"
    env = {**os.environ, "NIBBLE_MODEL__CHECKPOINT": str(warm_start)}
    argv = [NIBBLE, "run", "--config", str(ROOT / "configs" / "smoke.yaml"), "--out", str(out), "--prometheus"]
    return run_launcher(argv, timeout=600, env=env), out


def test_smoke_run_completes_and_writes_its_outputs(smoke_run):
    result, out = smoke_run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) >= SUMMARY_KEYS
    assert summary["steps"] == 6 and summary["weight_versions_published"] >= 5
    assert summary["eval_accuracy_before"] is not None and summary["eval_accuracy_after"] is not None
    for name in ("reward.png", "mismatch.png", "staleness.png", "metrics.jsonl", "config.yaml"):
        assert (out / name).is_file(), name
    for log in (out / "logs").glob("*.log"):
        assert "Traceback" not in log.read_text(), log.name


def test_the_end_of_run_output_is_a_short_human_summary(smoke_run):
    result, out = smoke_run
    summary = json.loads((out / "summary.json").read_text())
    monitoring = ("prometheus: http://127.0.0.1:", f"dashboard panels as PNG: nibble report run {out}")
    assert [x for x in result.stdout.splitlines() if x.startswith(monitoring)][-1] == monitoring[1]
    lines = [x for x in result.stdout.splitlines() if not x.startswith(monitoring)]  # the smoke run has --prometheus
    assert lines[0] == f"NIBBLE_MODEL__CHECKPOINT sets model.checkpoint = {summary['config']['model']['checkpoint']}"
    assert lines[1] == f"new run in {out}"
    assert lines[2].startswith("RL starts from held-out accuracy ") and "precision plan" in lines[2]
    tail = lines[lines.index(next(x for x in lines if x.startswith("finished 6/6 steps in "))) :]
    before, after = summary["eval_accuracy_before"], summary["eval_accuracy_after"]
    assert tail[1] == f"held-out accuracy  {before:.3f} → {after:.3f} ({after - before:+.3f})"
    assert tail[-1].startswith(f"summary: {out / 'summary.json'}")
    assert "{" not in result.stdout  # no Python dict
    assert all(" ETA " in x for x in lines if x.startswith("step "))


def test_versions_increase_and_staleness_stays_within_the_cap(smoke_run):
    _, out = smoke_run
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if x["step"] > 0]
    versions = [x["policy_version"] for x in steps]
    assert versions == sorted(versions) and versions[-1] > versions[0]
    assert all(x["staleness_mean"] <= 2 for x in steps)  # smoke.yaml: max_staleness 2
    samplers = [json.loads(p.read_text()) for p in (out / "samplers").glob("*.json")]
    assert len(samplers) == 2 and all(s["groups_written"] > 0 and s["policy_version"] > 0 for s in samplers)


def test_every_design_metric_is_exported_from_start_up():
    for role in ("sampler", "trainer", "weightsync"):
        text = generate_latest(Metrics(role).registry).decode()
        missing = [m for m, (kind, _) in DESIGN_METRICS.items() if f"# TYPE {m} {kind}\n" not in text]
        assert not missing, (role, missing)
        assert f'nibble_policy_version{{role="{role}"}} 0.0' in text


needs_prometheus = pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus (scripts/setup installs Debian's)")


@needs_prometheus
def test_the_runs_prometheus_scraped_every_service_and_evaluated_every_rule(smoke_run):
    result, out = smoke_run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "prometheus: http://127.0.0.1:" in result.stdout
    log = (out / "logs" / "prometheus.log").read_text()
    assert "Evaluating rule failed" not in log and "level=error" not in log, log[-3000:]
    panels = [(p.title, q.expr) for row in rows(HEADROOM_MARGIN) for p in row.panels for q in p.queries]
    recorded = [(f"recording rule {name}", name) for name in RECORDING_RULES]
    empty = []
    with tsdb_reader(out, free_port()) as read:
        pods = {labels.get("pod") for labels, _ in read("up == 1")}
        for what, expr in panels + recorded:
            if not any(points for _, points in read(expr)):
                empty.append(f"{what}: {expr}")
    assert pods == {"weightsync", "trainer", "sampler-0", "sampler-1"}
    assert not empty, "no data from the run's Prometheus for:\n" + "\n".join(empty)


@needs_prometheus
def test_report_run_renders_the_main_panels_from_the_runs_tsdb(smoke_run, tmp_path):
    _, out = smoke_run
    png = tmp_path / "dashboard.png"
    result = subprocess.run([NIBBLE, "report", "run", str(out), "--out", str(png)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    count = len(main_panels())
    assert f"{count} of {count} main panels, from its Prometheus TSDB" in result.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_run_without_a_tsdb_draws_what_metrics_jsonl_records(smoke_run, tmp_path):
    _, out = smoke_run
    shutil.copy(out / "metrics.jsonl", tmp_path / "metrics.jsonl")
    result = subprocess.run([NIBBLE, "report", "run", str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert f"5 of {len(main_panels())} main panels, from metrics.jsonl" in result.stdout
    assert (tmp_path / "dashboard.png").is_file()


def test_report_run_refuses_a_directory_that_is_not_a_run(tmp_path):
    for directory in (tmp_path / "missing", tmp_path):
        result = subprocess.run([NIBBLE, "report", "run", str(directory)], capture_output=True, text=True)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert str(directory) in result.stderr


def test_run_prometheus_without_the_binary_says_so_before_starting_anything(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path)}  # no prometheus (nor anything else) on PATH
    out = tmp_path / "run"
    result = subprocess.run(
        [NIBBLE, "run", "--config", str(ROOT / "configs" / "smoke.yaml"), "--out", str(out), "--prometheus"],
        capture_output=True, text=True, env={**env, "NIBBLE_MODEL__CHECKPOINT": str(tmp_path / "none")},
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert "--prometheus needs the prometheus binary" in result.stderr and "Traceback" not in result.stderr
    assert not (out / "logs").exists()
