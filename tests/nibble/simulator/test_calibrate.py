"""Measured floors and step times replacing the published ones (nibble.simulator.calibrate)."""

import itertools
import json
from pathlib import Path

import pytest

from nibble.simulator import Calibration, SimConfig, drift_model, load, published, simulate
from nibble.simulator.calibrate import ARTICLE_PLAN, PUBLISHED_SOURCE, WEIGHT_SYNC_SOURCE
from nibble.simulator.optimize import precision_plans, search

BENCHMARK = Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "mismatch.json"


def write(path, data):
    path.write_text(json.dumps(data))
    return path


def test_published_numbers_and_their_sources():
    cal = published()
    assert cal.floors == drift_model.PUBLISHED_FLOORS
    assert cal.rollout_seconds["nvfp4"] == 84.8 and cal.train_seconds["bf16"] == 64.3
    names = [name for name, _, _ in cal.rows()]
    assert len(names) == 4 + 4 + 5 + 4 and len(set(names)) == len(names)
    assert {s for _, _, s in cal.rows()} == {PUBLISHED_SOURCE, WEIGHT_SYNC_SOURCE}
    # uncalibrated, the one illustrative pause is every format's (results from before per-format pauses stand)
    assert cal.weight_sync_seconds == dict.fromkeys(drift_model.FORMAT_KEYS, 5.0)


def test_a_mismatch_file_replaces_only_what_it_holds_and_says_where_from(tmp_path):
    path = write(
        tmp_path / "mismatch.json",
        {
            "source": "nibble mismatch, tiny MoE",
            "floors": {"bf16": 0.012, "nvfp4_4o6": 0.035},
            "step_seconds": {"rollout": {"nvfp4_4o6": 50.0}, "train": {"nvfp4_dequantized": 40.0}, "weight_sync": 2},
        },
    )
    cal = load([path])
    assert cal.floors == {"bf16": 0.012, "mxfp8": 0.0203, "nvfp4": 0.0328, "nvfp4_4o6": 0.035}
    assert cal.rollout_seconds["nvfp4_4o6"] == 50.0 and cal.rollout_seconds["bf16"] == 109.4
    assert cal.train_seconds["nvfp4_dequantized"] == 40.0
    assert cal.sources["floors.nvfp4_4o6"] == f"{path} [nibble mismatch, tiny MoE]: floors.nvfp4_4o6"
    # one number, as files from before per-format pauses give it, is every format's pause
    assert cal.weight_sync_seconds == dict.fromkeys(drift_model.FORMAT_KEYS, 2.0)
    for key in drift_model.FORMAT_KEYS:
        assert cal.sources[f"weight_sync.{key}"].endswith("step_seconds.weight_sync (one number: every format's pause)")
    assert cal.sources["floors.mxfp8"] == PUBLISHED_SOURCE
    # The simulator uses them: the default NVFP4 + 4/6 run's floor and step time follow the file.
    summary = simulate(SimConfig(steps=10), cal, ghosts=False).summary()
    expected = drift_model.precision_floor(
        "nvfp4", four_over_six=True, bf16_last_15=True, bf16_shared_experts=True, floors=cal.floors
    )
    assert summary["precision_floor"] == expected
    assert simulate(SimConfig(steps=10, max_staleness=0, weight_sync=False), cal).run.timeline.steps[0].end < 60


def test_weight_sync_pauses_per_format_and_a_run_s_pause_is_its_format_s(tmp_path):
    path = write(tmp_path / "m.json", {"step_seconds": {"weight_sync": {"bf16": 0.16, "nvfp4": 1.13}}})
    cal = load([path])
    assert cal.weight_sync_seconds == {"bf16": 0.16, "mxfp8": 5.0, "nvfp4": 1.13, "nvfp4_4o6": 5.0}
    assert cal.sources["weight_sync.nvfp4"] == f"{path}: step_seconds.weight_sync.nvfp4"
    assert cal.sources["weight_sync.mxfp8"] == WEIGHT_SYNC_SOURCE
    # each plan swaps for its own format's pause: the BF16 baseline for 0.16 s, NVFP4 without 4/6 for 1.13 s
    naive = SimConfig(precision="nvfp4", four_over_six=False, steps=10)
    for config, pause in ((naive, 1.13), (naive.with_(precision="bf16", max_staleness=0), 0.16)):
        pauses = simulate(config, cal, ghosts=False).run.timeline.pauses
        assert pauses and all(p.end - p.start == pytest.approx(pause) for p in pauses)
    # a run's summary is one format's measurement, as its rollout time is
    (tmp_path / "run").mkdir()
    write(tmp_path / "run" / "summary.json", {"precision": "mxfp8", "weight_sync_seconds": 0.4})
    cal = load([tmp_path / "run"])
    assert cal.weight_sync_seconds == {"bf16": 5.0, "mxfp8": 0.4, "nvfp4": 5.0, "nvfp4_4o6": 5.0}
    with pytest.raises(ValueError, match=r"m\.json: field 'step_seconds\.weight_sync\.fp4' is unknown"):
        load([write(path, {"step_seconds": {"weight_sync": {"fp4": 1.0}}})])
    with pytest.raises(ValueError, match=r"m\.json: field 'step_seconds\.weight_sync\.bf16' must be a positive"):
        load([write(path, {"step_seconds": {"weight_sync": {"bf16": -1}}})])


@pytest.mark.parametrize("value", [[0.16, 1.13], None, "5", True])
def test_a_weight_sync_neither_object_nor_number_names_both_forms(tmp_path, value):
    # "must be a positive number of seconds, got [0.16, 1.13]" hid the per-format object the field now takes
    path = write(tmp_path / "m.json", {"step_seconds": {"weight_sync": value}})
    with pytest.raises(ValueError) as refused:
        load([path])
    message = str(refused.value)
    assert message.startswith(f"{path}: field 'step_seconds.weight_sync' must be an object of seconds per format key")
    assert "bf16, mxfp8, nvfp4, nvfp4_4o6" in message and "or one number of seconds" in message


def test_a_later_file_s_one_number_replaces_every_format_s_pause_an_earlier_file_set(tmp_path):
    per_format = write(tmp_path / "a.json", {"step_seconds": {"weight_sync": {"bf16": 0.16, "nvfp4": 1.13}}})
    one = write(tmp_path / "b.json", {"step_seconds": {"weight_sync": 2.0}})
    assert load([per_format, one]).weight_sync_seconds == dict.fromkeys(drift_model.FORMAT_KEYS, 2.0)
    assert load([one, per_format]).weight_sync_seconds == {"bf16": 0.16, "mxfp8": 2.0, "nvfp4": 1.13, "nvfp4_4o6": 2.0}


def test_floors_measured_under_another_plan_are_converted_so_the_model_reproduces_them(tmp_path):
    plan = {"bf16_last_15": False, "bf16_shared_experts": True}
    cal = load([write(tmp_path / "m.json", {"plan": plan, "floors": {"mxfp8": 0.03}})])
    assert "converted to the table floor" in cal.sources["floors.mxfp8"]
    model = drift_model.precision_floor("mxfp8", floors=cal.floors, **plan)
    assert model == pytest.approx(0.03, abs=1e-15)


def test_a_run_directory_summary_calibrates_its_precision(tmp_path):
    write(
        tmp_path / "summary.json",
        {
            "precision": "nvfp4",
            "four_over_six": True,
            "backward": "high_precision",
            "fresh_logprob_abs_diff_mean": 0.03,
            "logprob_abs_diff_mean": 0.05,
            "rollout_seconds_per_step": 70.0,
            "train_seconds_per_step": 60.0,
            "reward_mean": 0.5,  # other keys of a run summary are ignored
        },
    )
    cal = load([tmp_path])
    assert cal.floors["nvfp4_4o6"] == 0.03  # the staleness-0 number, not the all-token one
    assert cal.sources["floors.nvfp4_4o6"] == f"{tmp_path / 'summary.json'}: fresh_logprob_abs_diff_mean"
    assert cal.rollout_seconds["nvfp4_4o6"] == 70.0 and cal.train_seconds["nvfp4_high_precision"] == 60.0


def test_the_all_token_fallback_notes_staleness_and_later_files_win(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    write(run / "summary.json", {"precision": "mxfp8", "logprob_abs_diff_mean": 0.025, "max_staleness": 2})
    later = write(tmp_path / "later.json", {"floors": {"mxfp8": 0.021}})
    cal = load([run])
    assert "includes staleness mismatch" in cal.sources["floors.mxfp8"]
    assert load([run, later]).floors["mxfp8"] == 0.021


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "field 'rows[0]' must be an object"),  # a list: nibble mismatch --json rows
        ('{"floors": {"nvfp4": -1}}', "field 'floors.nvfp4' must be a number in [0, 1]"),
        ('{"floors": {"nvfp4": 1e300}}', "field 'floors.nvfp4' must be a number in [0, 1]"),
        ('{"floors": {"mxfp8": 1.5}}', "field 'floors.mxfp8' must be a number in [0, 1]"),
        ('{"floors": {"bf16": NaN}}', "field 'floors.bf16' must be a number in [0, 1]"),
        ('{"step_seconds": {"rollout": {"bf16": 1e300}}}', "field 'step_seconds.rollout.bf16' must be a positive"),
        ('{"step_seconds": {"weight_sync": 0}}', "field 'step_seconds.weight_sync' must be a positive"),
        ('{"floors": {"fp4": 0.03}}', "field 'floors.fp4' is unknown"),
        ('{"floorz": {}}', "field 'floorz' is unknown"),
        ('{"step_seconds": {"train": {"bf16": "fast"}}}', "field 'step_seconds.train.bf16' must be a positive"),
        ('{"plan": {"bf16_last_15": "yes"}}', "field 'plan.bf16_last_15' must be true or false"),
        ('{"source": "nothing measured"}', "holds no number to calibrate from"),
        ('{"floors": {"nvfp4": 0.03, "nvfp4": 0.5}}', "key 'nvfp4' appears twice in the object with keys nvfp4"),
    ],
)
def test_bad_mismatch_files_name_the_file_and_the_field(tmp_path, content, message):
    path = tmp_path / "mismatch.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=str(path)) as info:
        load([path])
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("summary", "message"),
    [
        ({"logprob_abs_diff_mean": 0.03}, "field 'precision' is missing"),
        ({"precision": "fp4"}, "field 'precision' must be one of bf16, mxfp8, nvfp4"),
        ({"precision": "bf16", "backward": "exact"}, "field 'backward' must be one of"),
        ({"precision": "bf16", "fresh_logprob_abs_diff_mean": "nan"}, "'fresh_logprob_abs_diff_mean' must be"),
        ({"precision": "nvfp4", "logprob_abs_diff_mean": 1e300}, "field 'logprob_abs_diff_mean' must be a number in"),
        ({"precision": "nvfp4", "four_over_six": "rms"}, "field 'four_over_six' must be one of true, false, null"),
        ({"precision": "nvfp4", "four_over_six": 1}, "field 'four_over_six' must be one of"),
        ({"config": {"plan": {"format": "fp4"}}}, "field 'config.plan.format' must be one of bf16, mxfp8"),
        (
            {"precision": "nvfp4", "config": {"plan": {"bf16_last_fraction": 0.3}}},
            "field 'config.plan.bf16_last_fraction' is 0.3; the model knows only 0 and 0.15",
        ),
    ],
)
def test_bad_run_summaries_name_the_file_and_the_field(tmp_path, summary, message):
    write(tmp_path / "summary.json", summary)
    with pytest.raises(ValueError, match=str(tmp_path)) as info:
        load([tmp_path])
    assert message in str(info.value)


def test_missing_paths_and_run_directories_without_a_summary(tmp_path):
    with pytest.raises(ValueError, match="no such file or directory"):
        load([tmp_path / "absent.json"])
    with pytest.raises(ValueError, match=r"must hold summary\.json"):
        load([tmp_path])


def rows(values: dict[str, float]) -> list[dict]:
    """``nibble mismatch --json`` rows: every plan label, both trainers; ``values`` gives plain_bf16 ones."""
    labels = ["bf16"] + [
        f"{name} tail15={a} shared_bf16={b}"
        for name in ("mxfp8", "nvfp4", "nvfp4+4/6")
        for a, b in itertools.product(("on", "off"), repeat=2)
    ]
    out = []
    for label in labels:
        out.append({"plan": label, "trainer": "same_quantized_forward", "logprob_abs_diff": 0.0,
                    "mismatch_kl": 0.0, "tokens": 100})  # fmt: skip
        value = values.get(label, 0.09)  # rows off the article's plan must not be read
        out.append({"plan": label, "trainer": "plain_bf16", "logprob_abs_diff": value,
                    "mismatch_kl": value / 10, "tokens": 100})  # fmt: skip
    return out


def article_floor(key: str, floors: dict[str, float]) -> float:
    """The model's floor of format ``key`` under the plan the article (and `nibble mismatch`'s rows) measured."""
    precision = "nvfp4" if key == "nvfp4_4o6" else key
    return drift_model.precision_floor(precision, four_over_six=key == "nvfp4_4o6", floors=floors, **ARTICLE_PLAN)


def test_nibble_mismatch_json_rows_calibrate_from_the_plain_bf16_article_plan_rows(tmp_path):
    measured = {
        "bf16": 0.0,  # trainer and sampler identical: exactly 0
        "mxfp8 tail15=on shared_bf16=off": 0.004,  # below the published BF16 floor, fine against its own
        "nvfp4 tail15=on shared_bf16=off": 0.05,
        "nvfp4+4/6 tail15=on shared_bf16=off": 0.044,
    }
    path = write(tmp_path / "rows.json", rows(measured))
    cal = load([path])
    keys = {"bf16": "bf16", "mxfp8 tail15=on shared_bf16=off": "mxfp8",
            "nvfp4 tail15=on shared_bf16=off": "nvfp4", "nvfp4+4/6 tail15=on shared_bf16=off": "nvfp4_4o6"}  # fmt: skip
    for label, key in keys.items():
        # The model gives back each measurement for the plan it was measured under.
        assert article_floor(key, cal.floors) == pytest.approx(measured[label], abs=1e-15), key
        source = cal.sources[f"floors.{key}"]
        assert source.startswith(f"{path} [nibble mismatch --json]: rows[") and f"plan {label!r}" in source
        assert "trainer plain_bf16" in source
    assert cal.floors["bf16"] == 0.0 and cal.floors["nvfp4"] == pytest.approx(0.042)
    # A BF16 floor of 0 and no staleness: m = m_eff = 0, a stable run (not an error).
    summary = simulate(SimConfig(precision="bf16", max_staleness=0, steps=30), cal).summary()
    assert summary["verdict"] == "stable" and summary["precision_floor"] == 0.0


def test_the_mismatch_benchmark_record_calibrates_and_says_which_rows():
    cal = load([BENCHMARK])
    record = json.loads(BENCHMARK.read_text())
    for key, label in (("bf16", "bf16"), ("mxfp8", "mxfp8 tail15=on shared_bf16=off"),
                       ("nvfp4", "nvfp4 tail15=on shared_bf16=off"),
                       ("nvfp4_4o6", "nvfp4+4/6 tail15=on shared_bf16=off")):  # fmt: skip
        (index,) = [i for i, r in enumerate(record["rows"]) if r["plan"] == label and r["trainer"] == "plain_bf16"]
        assert article_floor(key, cal.floors) == pytest.approx(record["rows"][index]["logprob_abs_diff"], abs=1e-15)
        assert f"[mismatch benchmark, checkpoint {record['checkpoint']}" in cal.sources[f"floors.{key}"]
        assert f": rows[{index}] (plan {label!r}, trainer plain_bf16" in cal.sources[f"floors.{key}"]
    for config in (SimConfig(precision="bf16", max_staleness=0, steps=30), SimConfig(steps=30)):
        assert simulate(config, cal).summary()["verdict"] in ("stable", "will_diverge", "diverged")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('[{"plan": "fp4 tail15=on shared_bf16=off", "trainer": "plain_bf16", "logprob_abs_diff": 0.1}]',
         "field 'rows[0].plan' must be one of bf16, "),
        ('[{"plan": "bf16", "trainer": "fp32", "logprob_abs_diff": 0.1}]', "field 'rows[0].trainer' must be one of"),
        ('[{"plan": "bf16", "trainer": "plain_bf16"}]', "field 'rows[0].logprob_abs_diff' must be a number"),
        ('[{"plan": "bf16", "trainer": "plain_bf16", "logprob_abs_diff": 1e300}]', "'rows[0].logprob_abs_diff'"),
        ('[{"plan": "bf16", "trainer": "same_quantized_forward", "logprob_abs_diff": 0}]',
         "holds no number to calibrate from (no plain_bf16 row for plan 'bf16', 'mxfp8 tail15=on shared_bf16=off'"),
        ('{"benchmark": "mismatch", "rows": [3]}', "field 'rows[0]' must be an object"),
        ('{"benchmark": "mismatch", "rows": {}}', "field 'rows' must be a list of rows"),
        ('{"benchmark": "throughput", "rows": []}', "field 'benchmark' must be \"mismatch\""),
        ('"rows"', "the top level must be a JSON object"),
    ],
)  # fmt: skip
def test_bad_mismatch_rows_name_the_file_and_the_field(tmp_path, content, message):
    path = tmp_path / "mismatch.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=str(path)) as info:
        load([path])
    assert message in str(info.value)


def test_nvfp4_without_four_over_six_reproduces_its_measurement_under_the_measured_plan(tmp_path):
    # The model adds 0.008 for NVFP4 without 4/6 on top of the table floor: the conversion takes it off.
    cal = load([write(tmp_path / "m.json", {"floors": {"nvfp4": 0.03}})])
    model = drift_model.precision_floor("nvfp4", four_over_six=False, floors=cal.floors, **ARTICLE_PLAN)
    assert model == pytest.approx(0.03, abs=1e-15)
    assert "+0.008 for NVFP4 without 4/6 taken off" in cal.sources["floors.nvfp4"]
    for last_15, shared in itertools.product((False, True), repeat=2):
        plan = {"bf16_last_15": last_15, "bf16_shared_experts": shared}
        cal = load([write(tmp_path / "p.json", {"plan": plan, "floors": {"nvfp4": 0.045}})])
        assert drift_model.precision_floor("nvfp4", floors=cal.floors, **plan) == pytest.approx(0.045, abs=1e-15)
    # The same through a run summary (NVFP4, 4/6 off).
    write(tmp_path / "summary.json", {"precision": "nvfp4", "four_over_six": None, "fresh_logprob_abs_diff_mean": 0.03})
    cal = load([tmp_path])
    assert drift_model.precision_floor("nvfp4", floors=cal.floors, **ARTICLE_PLAN) == pytest.approx(0.03, abs=1e-15)


def test_floors_below_bf16_s_are_clamped_to_it_with_a_note_and_every_plan_runs(tmp_path):
    path = write(tmp_path / "low.json", {"floors": {"bf16": 0.5, "nvfp4_4o6": 0.01}})
    cal = load([path])
    assert cal.floors == {"bf16": 0.5, "mxfp8": 0.5, "nvfp4": 0.5, "nvfp4_4o6": 0.5}
    assert cal.sources["floors.nvfp4_4o6"].startswith(f"{path}: floors.nvfp4_4o6; clamped from 0.01 to floors.bf16")
    assert cal.sources["floors.mxfp8"].startswith(f"{PUBLISHED_SOURCE}; clamped from 0.0203")
    for plan in precision_plans():
        plan = {k: v for k, v in plan.items() if k != "dequantized_backward"}
        assert drift_model.precision_floor(floors=cal.floors, **plan) >= 0.5, plan
    candidates = search(SimConfig(steps=10), cal, seeds=1, max_samplers=1)  # used to fail: m_eff=-0.157…
    assert len(candidates) == 25 * 9 and not any(c.stable for c in candidates)
    # A small model's floor below the published BF16 floor: clamped, and the model's floor is BF16's.
    cal = load([write(tmp_path / "small.json", {"floors": {"nvfp4_4o6": 0.004, "nvfp4": 0.012}})])
    assert cal.floors["nvfp4_4o6"] == cal.floors["nvfp4"] == 0.0103  # nvfp4: 0.012 − 0.008 < 0.0103
    assert "clamped" in cal.sources["floors.nvfp4"]


def test_the_bf16_floor_of_a_later_file_converts_the_floors_of_an_earlier_one(tmp_path):
    plan = {"bf16_last_15": False, "bf16_shared_experts": False}
    first = write(tmp_path / "a.json", {"plan": plan, "floors": {"mxfp8": 0.03}})
    second = write(tmp_path / "b.json", {"floors": {"bf16": 0.005}})
    cal = load([first, second])
    assert drift_model.precision_floor("mxfp8", floors=cal.floors, **plan) == pytest.approx(0.03, abs=1e-15)


def test_a_calibration_is_checked_on_construction():
    cal = published()
    sync = cal.weight_sync_seconds
    with pytest.raises(ValueError, match=r"floors\.mxfp8=0\.001 is below floors\.bf16"):
        Calibration(dict(cal.floors, mxfp8=0.001), cal.rollout_seconds, cal.train_seconds, sync, cal.sources)
    with pytest.raises(ValueError, match=r"floors\.nvfp4=inf must lie in"):
        Calibration(dict(cal.floors, nvfp4=float("inf")), cal.rollout_seconds, cal.train_seconds, sync, cal.sources)
    with pytest.raises(ValueError, match=r"weight_sync\.nvfp4=0 must be a number of seconds"):
        Calibration(cal.floors, cal.rollout_seconds, cal.train_seconds, dict(sync, nvfp4=0), cal.sources)
    with pytest.raises(ValueError, match=r"calibration weight_sync must have the keys bf16, mxfp8, nvfp4, nvfp4_4o6"):
        Calibration(cal.floors, cal.rollout_seconds, cal.train_seconds, {"bf16": 1.0}, cal.sources)


def test_a_summary_with_nibble_s_own_plan_values(tmp_path):
    write(
        tmp_path / "summary.json",
        {
            "precision": "nvfp4",
            "four_over_six": "mse",
            "backward": "quantized",
            "fresh_logprob_abs_diff_mean": 0.031,
            "train_seconds_per_step": 55.0,
        },
    )
    cal = load([tmp_path])
    assert cal.floors["nvfp4_4o6"] == 0.031
    # The model has no quantized backward: the time is filed under the dequantized one, and says so.
    assert cal.train_seconds["nvfp4_dequantized"] == 55.0
    assert "backward 'quantized', filed under the dequantized backward" in cal.sources["train.nvfp4_dequantized"]
    write(tmp_path / "summary.json", {"precision": "nvfp4", "four_over_six": "mae", "logprob_abs_diff_mean": 0.02})
    assert load([tmp_path]).floors["nvfp4_4o6"] == 0.02


def test_the_summary_nibble_run_writes(tmp_path):
    from nibble.analysis.run_report import summarize
    from nibble.config import PlanConfig, RunConfig, TrainerConfig
    from nibble.rundir import Segment

    config = RunConfig(
        plan=PlanConfig(format="nvfp4", four_over_six="mse", backward="quantized", bf16_shared_experts=True),
        trainer=TrainerConfig(max_staleness=2),
    )
    steps = [
        {"step": k, "reward_mean": 0.5, "trained_tokens": 1000, "idle_seconds": 0.0, "staleness_mean": 1.0,
         "logprob_abs_diff": value, "fresh_logprob_abs_diff": None, "policy_version": k}
        for k, value in ((1, 0.03), (2, 0.034))
    ]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in steps))
    summary = summarize(tmp_path, config, [Segment(0.0, 0, "finished", ended_at=10.0)])
    assert summary["fresh_logprob_abs_diff_mean"] is None and summary["four_over_six"] is True
    write(tmp_path / "summary.json", summary)
    cal = load([tmp_path])
    # No staleness-0 mean: the all-token one, flagged; the plan (last 15% and shared experts BF16) comes from
    # config.plan, and the model gives back the measurement for it.
    plan = {"bf16_last_15": True, "bf16_shared_experts": True}
    model = drift_model.precision_floor("nvfp4", four_over_six=True, floors=cal.floors, **plan)
    assert model == pytest.approx(0.032, abs=1e-15)
    source = cal.sources["floors.nvfp4_4o6"]
    assert source.startswith(f"{tmp_path / 'summary.json'}: logprob_abs_diff_mean (all tokens of a run with max_st")
    assert "bf16_shared_experts=True; converted to the table floor" in source
