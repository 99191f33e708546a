"""The drift model driven by a stability grid's runs (``nibble report stability --simulate``): the plan
mapping, the predictions against closed forms, the staleness fit, and the CPU grid's file."""

import copy
import json
import math
from pathlib import Path

import pytest

from nibble.analysis.stability_compare import (
    ASYNC_STALENESS,
    PLAN_DEFAULTS,
    compare,
    fit_staleness,
    markdown,
    sim_config,
    speed_ups,
)
from nibble.analysis.stability_report import load_results, variant_rows
from nibble.simulator import SimConfig, drift_model, load, published
from nibble.simulator.timeline import build_timeline

REPO = Path(__file__).resolve().parents[3]
CPU_GRID = REPO / "benchmarks" / "results" / "stability.json"


def variants() -> dict:
    from benchmarks.stability.variants import VARIANTS

    return copy.deepcopy(VARIANTS)


def test_plan_defaults_are_the_precision_plan_s():
    from nibble.recipe import PrecisionPlan

    plan = PrecisionPlan(num_layers=4)
    assert {k: getattr(plan, k) for k in PLAN_DEFAULTS} == PLAN_DEFAULTS


def test_each_variant_maps_to_the_model_s_knobs():
    configs = {name: sim_config(name, knobs) for name, knobs in variants().items()}
    naive = configs["nvfp4_naive"]
    assert naive.precision == "nvfp4" and not naive.four_over_six and not naive.dequantized_backward
    assert not naive.bf16_last_15 and not naive.bf16_shared_experts
    assert configs["nvfp4_4o6_deq"].four_over_six and configs["nvfp4_4o6_deq"].dequantized_backward
    recipe = configs["recipe"]
    assert recipe.four_over_six and recipe.dequantized_backward and recipe.bf16_last_15 and recipe.bf16_shared_experts
    # the model has no activation-scale knob: per-token and per-tensor map to the same configuration
    assert configs["nvfp4_token"] == naive and configs["nvfp4_token_deq"] == configs["nvfp4_deq"]
    assert configs["mxfp8"].precision == "mxfp8" and configs["bf16"].precision == "bf16"
    with pytest.raises(ValueError, match=r"variant 'odd': bf16_last_fraction 0\.3; the model knows only 0 and 0\.15"):
        sim_config("odd", {"format": "nvfp4", "bf16_last_fraction": 0.3})
    with pytest.raises(ValueError, match="variant 'odd': format 'int4'"):
        sim_config("odd", {"format": "int4"})


def synthetic(staleness: dict[str, float], steps: int = 60, spike_at: int | None = None) -> dict:
    """One run per variant with constant staleness; ``logprob_abs_diff = 0.02 + 0.03·s^1.5`` exactly;
    the naive variant's grad norm spikes at ``spike_at``."""
    runs = []
    for variant, s in staleness.items():
        records = []
        for i in range(1, steps + 1):
            gap = s if i > 1 else 0.0
            records.append({
                "step": i, "grad_norm": 100.0 if (variant == "nvfp4_naive" and i == spike_at) else 1.0,
                "reward": 0.3, "eval_accuracy": 0.3 if i % 10 == 0 else None,
                "logprob_abs_diff": 0.02 + 0.03 * gap**1.5, "fresh_logprob_abs_diff": 0.02 if gap == 0 else None,
                "skipped_updates": 0, "staleness_mean": gap,
            })  # fmt: skip
        runs.append({"variant": variant, "seed": 3, "warm_start_accuracy": 0.3, "steps": records})
    return {"benchmark": "stability", "variants": variants(), "runs": runs}


def test_predictions_follow_the_model_and_measurements_the_runs():
    data = synthetic({"bf16": 0.0, "nvfp4_naive": 0.5, "recipe": 4.0}, spike_at=30)
    rows = {r.variant: r for r in compare(data, published())}
    for name, s in (("bf16", 0.0), ("nvfp4_naive", 0.5), ("recipe", 4.0)):
        config = sim_config(name, data["variants"][name])
        f = drift_model.precision_floor(
            config.precision, four_over_six=config.four_over_six, bf16_last_15=config.bf16_last_15,
            bf16_shared_experts=config.bf16_shared_experts,
        )  # fmt: skip
        row = rows[name]
        assert row.floor == pytest.approx(f) and row.predicted_fresh_mismatch == pytest.approx(0.5 * f)
        m = [0.5 * f] + [0.011 * s**1.5 + 0.5 * f] * 59
        assert row.predicted_mismatch.mean == pytest.approx(sum(m) / 60)
        assert row.measured_mismatch.mean == pytest.approx((0.02 + 59 * (0.02 + 0.03 * s**1.5)) / 60)
        assert row.fit is None if s == 0 else row.fit.coefficient == pytest.approx(0.03)
    # m = 0.011·8 + 0.5·f at staleness 4 is past the critical 0.044: the model collapses the recipe; the runs do not
    assert rows["recipe"].predicted_collapses == 1 and rows["recipe"].measured_collapses == 0
    assert rows["bf16"].predicted_collapses == 0
    # the law: naive NVFP4 spikes with p = 0.08; one measured grad-norm spike in 55 judged steps
    assert rows["nvfp4_naive"].law_spikes_per_100 == pytest.approx(8.0)
    assert rows["nvfp4_naive"].predicted_spikes_per_100.mean > 0
    assert rows["nvfp4_naive"].measured_spikes_per_100.mean == pytest.approx(100 / 55)
    assert rows["bf16"].law_spikes_per_100 == 0 and rows["bf16"].predicted_spikes_per_100.mean == 0
    text = markdown(list(rows.values()), published(), [], ["every variant: no step times"])
    assert text.startswith("| variant |") and text.count("\n| ") == 3 and "published: The 4-Bitter Lesson" in text
    assert "- skipped: every variant: no step times" in text


def timed(data: dict, seconds: dict[str, tuple[float, float, float]]) -> dict:
    """``data`` with every step of the variants in ``seconds`` timed: generate, train, publish seconds."""
    for run in data["runs"]:
        if run["variant"] in seconds:
            g, t, p = seconds[run["variant"]]
            for step in run["steps"]:
                step.update(generate_seconds=g, train_seconds=t, publish_seconds=p, eval_seconds=None)
    return data


def test_speed_ups_run_each_plan_on_its_own_pause_and_skip_what_the_file_does_not_time(tmp_path):
    data = synthetic({"bf16": 1.0, "nvfp4_naive": 1.0, "nvfp4_token": 1.0, "recipe": 1.0, "mxfp8": 1.0}, steps=4)
    timed(data, {"bf16": (1.53, 0.44, 0.16), "nvfp4_naive": (2.07, 0.53, 1.13), "nvfp4_token": (2.0, 0.5, 1.0),
                 "mxfp8": (1.8, 0.4, 0.9)})  # fmt: skip
    path = _write(tmp_path, data)
    speeds, skipped = speed_ups(path, data, load([path]))
    assert [s.variant for s in speeds] == ["bf16", "nvfp4_naive", "mxfp8"]
    naive = SimConfig(precision="nvfp4", four_over_six=False, dequantized_backward=False, bf16_last_15=False,
                      bf16_shared_experts=False, max_staleness=ASYNC_STALENESS)  # fmt: skip
    baseline = build_timeline(naive.with_(precision="bf16", max_staleness=0), 1.53, 0.44, 0.16).end_time
    assert speeds[1].config == naive and speeds[1].seconds == (2.07, 0.53, 1.13)
    assert speeds[1].speed == pytest.approx(baseline / build_timeline(naive, 2.07, 0.53, 1.13).end_time)
    assert speeds[0].sync_bf16_wall_clock_seconds == pytest.approx(baseline)
    assert skipped == [
        "nvfp4_token: its plan is none the step times are calibrated for (bf16, mxfp8, NVFP4's naive forward with or "
        "without 4/6): the simulator would run it on another variant's times",
        "recipe: no run of it records step times",
    ]
    # NVFP4 + 4/6 alone: its high-precision train time (nvfp4_naive's) and BF16's are not the file's
    data = timed(synthetic({"nvfp4_4o6": 1.0}, steps=4), {"nvfp4_4o6": (2.0, 0.5, 1.2)})
    path = _write(tmp_path, data)
    assert speed_ups(path, data, load([path])) == ([], [
        "nvfp4_4o6: the file times no run behind train.nvfp4_high_precision, rollout.bf16, train.bf16, weight_sync.bf16"
    ])  # fmt: skip


def test_the_fit_recovers_a_known_law_and_needs_two_staleness_values():
    runs = [{"steps": [{"staleness_mean": s, "logprob_abs_diff": 0.01 + 0.02 * s**1.5} for s in (0, 1, 2.5, 4)]}]
    fit = fit_staleness(runs)
    assert (fit.intercept, fit.coefficient) == (pytest.approx(0.01), pytest.approx(0.02))
    assert fit.points == 4 and fit.s_range == (0, 4)
    assert fit_staleness([{"steps": [{"staleness_mean": 1.0, "logprob_abs_diff": 0.1}] * 3}]) is None


def test_bad_runs_are_named():
    data = synthetic({"bf16": 1.0})
    data["runs"][0]["steps"][4]["staleness_mean"] = None
    with pytest.raises(ValueError, match=r"runs\[0\]\.steps\[4\]\.staleness_mean = None"):
        compare(data, published())
    data = synthetic({"bf16": 1.0})
    data["variants"].pop("bf16")
    with pytest.raises(ValueError, match=r"runs\[0\]: variant 'bf16' is not in the file's 'variants'"):
        compare(data, published())


def test_the_cpu_grid_compares_every_variant_and_agrees_with_the_report():
    data = load_results(CPU_GRID)
    rows = compare(data, published())
    report = variant_rows(data)
    assert [r.variant for r in rows] == [r.variant for r in report] and len(rows) == 10
    for mine, theirs in zip(rows, report, strict=True):
        assert mine.seeds == theirs.seeds == 5 and mine.measured_collapses == theirs.collapses
        assert mine.measured_spikes_per_100 == theirs.spikes_per_100
        assert math.isfinite(mine.predicted_mismatch.mean) and 0 <= mine.fit.s_range[0] <= mine.fit.s_range[1] <= 4
    assert json.loads(CPU_GRID.read_text())["setting"]["max_staleness"] == 4


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "grid.json"
    path.write_text(json.dumps(data))  # NaN and Infinity as Python's json writes them
    return path


def _step(data: dict, run: int, index: int, **fields) -> dict:
    data["runs"][run]["steps"][index].update(fields)
    return data


def _run(data: dict, run: int, **fields) -> dict:
    data["runs"][run].update(fields)
    return data


RUN = r"grid\.json: runs\[1\] \(variant 'nvfp4_naive', seed 3\)"
NONSENSE = [
    (lambda d: _step(d, 1, 4, staleness_mean=1e308), RUN + r", steps\[4\] \(step 5\): staleness_mean = 1e\+308"),
    (lambda d: _step(d, 1, 4, staleness_mean=10**400), RUN + r", steps\[4\] \(step 5\): staleness_mean = 1000"),
    (lambda d: _step(d, 1, 4, staleness_mean=math.nan), RUN + r", steps\[4\] \(step 5\): staleness_mean = nan"),
    (lambda d: _step(d, 1, 4, staleness_mean=math.inf), RUN + r", steps\[4\] \(step 5\): staleness_mean = inf"),
    (lambda d: _step(d, 1, 4, staleness_mean=4.5), r"staleness_mean = 4\.5: expected a number in \[0, 4\]"),
    (lambda d: _step(d, 1, 4, reward=math.nan), RUN + r", steps\[4\] \(step 5\): reward = nan: expected a finite"),
    (lambda d: _step(d, 1, 4, reward=-math.inf), r"step 5\): reward = -inf"),
    (lambda d: _step(d, 1, 4, reward=1.5), r"step 5\): reward = 1\.5: expected a number in \[0, 1\]"),
    (lambda d: _step(d, 1, 4, reward=-0.1), r"step 5\): reward = -0\.1: expected a number in \[0, 1\]"),
    (lambda d: _step(d, 1, 4, logprob_abs_diff=-0.01), r"step 5\): logprob_abs_diff = -0\.01: expected a number ≥ 0"),
    (lambda d: _step(d, 1, 4, logprob_abs_diff=math.inf), r"step 5\): logprob_abs_diff = inf: expected a finite"),
    (lambda d: _step(d, 1, 4, logprob_abs_diff=math.nan), r"step 5\): logprob_abs_diff = nan"),
    (lambda d: _step(d, 1, 4, fresh_logprob_abs_diff=-1.0), r"step 5\): fresh_logprob_abs_diff = -1\.0"),
    (lambda d: _step(d, 1, 9, eval_accuracy=1.2), RUN + r", steps\[9\] \(step 10\): eval_accuracy = 1\.2"),
    (lambda d: _step(d, 1, 9, eval_accuracy=math.nan), r"step 10\): eval_accuracy = nan"),
    (lambda d: _run(d, 1, warm_start_accuracy=-0.2), RUN + r": warm_start_accuracy = -0\.2"),
    (lambda d: _step(d, 1, 4, grad_norm=-1.0), r"step 5\): grad_norm = -1\.0: expected a number ≥ 0"),
    (lambda d: _run(d, 1, variant="bf16", seed=3), r"runs\[1\] \(variant 'bf16', seed 3\) repeats runs\[0\]"),
    (lambda d: _step(d, 1, 4, step=4), RUN + r", steps\[4\] \(step 4\): step 4 repeats step 4"),
    (lambda d: _step(d, 1, 4, step=2), RUN + r", steps\[4\] \(step 2\): step 2 comes after step 4"),
    (lambda d: _step(d, 1, 0, step=0), RUN + r", steps\[0\] \(step 0\): step 0: step numbers start at 1"),
    (lambda d: _step(d, 1, 0, step=-3), r"step -3: step numbers start at 1"),
]


@pytest.mark.parametrize(("change", "message"), NONSENSE)
def test_a_results_file_with_nonsense_numbers_is_refused_naming_file_run_and_step(tmp_path, change, message):
    data = synthetic({"bf16": 1.0, "nvfp4_naive": 2.0}, steps=12)
    data["setting"] = {"max_staleness": 4}
    load_results(_write(tmp_path, data))  # the file as made is fine
    with pytest.raises(ValueError, match=message):
        load_results(_write(tmp_path, change(data)))


def test_non_finite_grad_norms_are_skipped_updates_and_custom_rewards_any_finite_number(tmp_path):
    data = synthetic({"bf16": 1.0}, steps=12)
    _step(data, 0, 3, grad_norm=math.nan, skipped_updates=1)
    _step(data, 0, 4, grad_norm=math.inf, skipped_updates=1)
    load_results(_write(tmp_path, data))
    _step(data, 0, 5, reward=-2.5)
    data["task"] = {"name": "jsonl", "options": {"reward": "mypackage.rewards:score"}}  # any finite number
    load_results(_write(tmp_path, data))
    _step(data, 0, 5, reward=math.nan)
    with pytest.raises(ValueError, match=r"step 6\): reward = nan: expected a finite number$"):
        load_results(_write(tmp_path, data))


@pytest.mark.parametrize(
    ("benchmark", "message"),
    [
        ("stability_pilots", r"pilots\.json: a stability pilots file .*not a stability grid's results file"),
        ("mismatch", r"pilots\.json: a mismatch benchmark's record, not a stability grid's results file"),
    ],
)
def test_another_benchmark_s_file_is_named(tmp_path, benchmark, message):
    path = tmp_path / "pilots.json"
    path.write_text(json.dumps({"benchmark": benchmark, "points": [], "chosen": None}))
    with pytest.raises(ValueError, match=message):
        load_results(path)


def test_compare_refuses_a_staleness_whose_cost_overflows_naming_run_and_step():
    data = synthetic({"bf16": 1.0})
    _step(data, 0, 4, staleness_mean=1e300)  # finite, but s^1.5 is not: what a file without a setting allows
    named = r"runs\[0\]\.steps\[4\]\.staleness_mean = 1e\+300 \(variant 'bf16', seed 3, step 5\)"
    with pytest.raises(ValueError, match=named):
        compare(data, published())
    _step(data, 0, 4, staleness_mean=10**400)
    with pytest.raises(ValueError, match=r"runs\[0\]\.steps\[4\]\.staleness_mean = 1000"):
        compare(data, published())


def test_the_recorded_grids_still_load():
    for name in ("stability.json", "stability_smollm2.json", "h200_stability_smoke.json"):
        assert load_results(REPO / "benchmarks" / "results" / name)["runs"]
