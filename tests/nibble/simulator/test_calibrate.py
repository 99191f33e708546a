"""Measured floors and step times replacing the published ones (nibble.simulator.calibrate)."""

import json

import pytest

from nibble import stability
from nibble.simulator import SimConfig, load, published, simulate
from nibble.simulator.calibrate import PUBLISHED_SOURCE, WEIGHT_SYNC_SOURCE


def write(path, data):
    path.write_text(json.dumps(data))
    return path


def test_published_numbers_and_their_sources():
    cal = published()
    assert cal.floors == stability.PUBLISHED_FLOORS
    assert cal.rollout_seconds["nvfp4"] == 84.8 and cal.train_seconds["bf16"] == 64.3
    names = [name for name, _, _ in cal.rows()]
    assert len(names) == 4 + 4 + 5 + 1 and len(set(names)) == len(names)
    assert {s for _, _, s in cal.rows()} == {PUBLISHED_SOURCE, WEIGHT_SYNC_SOURCE}


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
    assert cal.train_seconds["nvfp4_dequantized"] == 40.0 and cal.weight_sync_seconds == 2.0
    assert cal.sources["floors.nvfp4_4o6"] == f"{path} [nibble mismatch, tiny MoE]: floors.nvfp4_4o6"
    assert cal.sources["weight_sync"].endswith("step_seconds.weight_sync")
    assert cal.sources["floors.mxfp8"] == PUBLISHED_SOURCE
    # The simulator uses them: the default NVFP4 + 4/6 run's floor and step time follow the file.
    summary = simulate(SimConfig(steps=10), cal, ghosts=False).summary()
    expected = stability.precision_floor(
        "nvfp4", four_over_six=True, bf16_last_15=True, bf16_shared_experts=True, floors=cal.floors
    )
    assert summary["precision_floor"] == expected
    assert simulate(SimConfig(steps=10, max_staleness=0, weight_sync=False), cal).run.timeline.steps[0].end < 60


def test_floors_measured_under_another_plan_are_converted_so_the_model_reproduces_them(tmp_path):
    plan = {"bf16_last_15": False, "bf16_shared_experts": True}
    cal = load([write(tmp_path / "m.json", {"plan": plan, "floors": {"mxfp8": 0.03}})])
    assert "converted to the table floor" in cal.sources["floors.mxfp8"]
    model = stability.precision_floor("mxfp8", floors=cal.floors, **plan)
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
        ("[1, 2]", "the top level must be a JSON object"),
        ('{"floors": {"nvfp4": -1}}', "field 'floors.nvfp4' must be a positive finite number, got -1"),
        ('{"floors": {"fp4": 0.03}}', "field 'floors.fp4' is unknown"),
        ('{"floorz": {}}', "field 'floorz' is unknown"),
        ('{"step_seconds": {"train": {"bf16": "fast"}}}', "field 'step_seconds.train.bf16' must be a positive"),
        ('{"plan": {"bf16_last_15": "yes"}}', "field 'plan.bf16_last_15' must be true or false"),
        ('{"source": "nothing measured"}', "holds no number to calibrate from"),
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
