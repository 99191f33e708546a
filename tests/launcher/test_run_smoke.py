"""``nibble run`` end to end on configs/smoke.yaml: real processes, a real redis-server, real gRPC."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from nibble.metrics import Metrics
from tests.helpers import DESIGN_METRICS

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
    result = subprocess.run(
        [NIBBLE, "run", "--config", str(ROOT / "configs" / "smoke.yaml"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    return result, out


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
    lines = result.stdout.splitlines()
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
