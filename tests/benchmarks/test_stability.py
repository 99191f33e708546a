"""A miniature of the stability grid (two variants × two seeds, a few steps) through the real sampler,
trainer and weight-sync code paths, then the report command on its JSON. It checks the harness, the
definitions and the report work together, not the scientific outcome."""

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.stability import VARIANTS, Setting, dumps, results_document, run_grid
from nibble.analysis.stability_report import load_results, variant_rows

NIBBLE = str(Path(sys.executable).with_name("nibble"))
TINY = Setting(steps=4, groups_per_step=2, group_size=4, groups_per_batch=1, max_new_tokens=8, max_staleness=2,
               eval_every=2, eval_size=32)  # fmt: skip


def test_variants_differ_from_the_naive_one_only_in_the_techniques_they_name():
    naive = VARIANTS["nvfp4_naive"]
    assert naive["activation_scale"] == "per_tensor" and naive["four_over_six"] is None
    assert naive["backward"] == "high_precision" and naive["bf16_last_fraction"] == 0.0
    assert not naive["bf16_shared_experts"]
    changed = {k for k, v in VARIANTS["nvfp4_token_deq"].items() if naive[k] != v}
    assert changed == {"activation_scale", "backward"}
    recipe = VARIANTS["recipe"]
    assert recipe["four_over_six"] == "mse" and recipe["bf16_last_fraction"] == 0.15 and recipe["bf16_shared_experts"]
    assert len([v for v in VARIANTS if v.startswith("nvfp4_")]) == 1 + 3 + 3 + 1


def test_miniature_grid_records_every_step_and_reports(warm_start, tmp_path):
    runs = run_grid(warm_start, ["bf16", "nvfp4_naive"], [0, 1], TINY)
    assert [(r["variant"], r["seed"]) for r in runs] == [(v, s) for s in (0, 1) for v in ("bf16", "nvfp4_naive")]
    for run in runs:
        steps = run["steps"]
        assert [s["step"] for s in steps] == [1, 2, 3, 4]
        assert [s["eval_accuracy"] is not None for s in steps] == [False, True, False, True]
        # a norm of 0 is a batch without learning signal (every group's rewards equal)
        assert all(s["grad_norm"] >= 0 and 0 <= s["reward"] <= 1 and s["entropy"] > 0 for s in steps)
        assert steps[0]["staleness_mean"] == 0 and steps[0]["fresh_logprob_abs_diff"] is not None
        assert all(s["staleness_mean"] <= TINY.max_staleness for s in steps)
    # the same seed draws the same prompts and staleness lags for every variant
    assert [s["staleness_mean"] for s in runs[0]["steps"]] == [s["staleness_mean"] for s in runs[1]["steps"]]
    bf16 = [s for r in runs if r["variant"] == "bf16" for s in r["steps"] if s["fresh_logprob_abs_diff"] is not None]
    assert all(s["fresh_logprob_abs_diff"] < 1e-5 for s in bf16)  # the trainer reproduces its own sampler
    path = tmp_path / "stability.json"
    document = results_document(runs, TINY, warm_start, "pytest miniature", 0.0)
    path.write_text(dumps(document))
    assert json.loads(path.read_text()) == json.loads(json.dumps(document))
    rows = variant_rows(load_results(path))
    assert [(r.variant, r.seeds) for r in rows] == [("bf16", 2), ("nvfp4_naive", 2)]
    out = tmp_path / "report"
    result = subprocess.run(
        [NIBBLE, "report", "stability", str(path), "--out", str(out)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert (out / "table.md").read_text().count("\n") == 4
    assert all((out / name).stat().st_size > 1000 for name in ("grad_norm.png", "reward.png", "accuracy.png"))
