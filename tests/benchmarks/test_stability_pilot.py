"""The pilots that choose the grid's learning rate and staleness: the fixed choice rule on constructed
summaries, and a real (tiny, CPU) pilot through the command."""

import json
from pathlib import Path

import pytest

from benchmarks.stability.pilot import Point, choose, main, summarize


def _summary(spikiness: float, mismatch: float, rewards=(0.2, 0.3), non_finite: int = 0) -> dict:
    return {
        "grad_norm_max_over_median": spikiness,
        "non_finite_norms": non_finite,
        "logprob_abs_diff_mean": mismatch,
        "reward_first_half": rewards[0],
        "reward_second_half": rewards[1],
        "seconds_per_step": 1.0,
    }


def test_the_point_where_naive_is_furthest_from_bf16_is_chosen_among_usable_ones():
    calm, stressed, falling, broken = Point(1e-5, 2), Point(1e-4, 4), Point(3e-4, 4), Point(1e-3, 4)
    points = {
        calm: {"nvfp4_naive": _summary(2.0, 0.3), "bf16": _summary(2.0, 0.03)},
        stressed: {"nvfp4_naive": _summary(9.0, 0.3), "bf16": _summary(3.0, 0.03)},
        # the most naive-vs-bf16 contrast, but bf16 itself stops learning: not a setting to measure in
        falling: {"nvfp4_naive": _summary(50.0, 0.3), "bf16": _summary(2.0, 0.03, rewards=(0.3, 0.1))},
        broken: {"nvfp4_naive": _summary(5.0, 0.3, non_finite=1), "bf16": _summary(2.0, 0.03)},
    }
    chosen, verdicts = choose(points)
    assert chosen == stressed
    points[Point(1e-2, 4)] = {"nvfp4_naive": {"error": "OutOfMemoryError: CUDA out of memory"}, "bf16": _summary(9, 9)}
    assert choose(points)[0] == stressed
    assert "OutOfMemoryError" in choose(points)[1][Point(1e-2, 4)]
    del points[Point(1e-2, 4)]
    assert verdicts[falling].startswith("not usable: bf16") and verdicts[broken].startswith("not usable: a non")
    assert verdicts[calm].startswith("usable") and verdicts[stressed].startswith("usable")
    # ties in spikiness are broken by the mismatch ratio
    points[calm]["nvfp4_naive"] = _summary(6.0, 0.6)
    points[calm]["bf16"] = _summary(2.0, 0.03)
    assert choose(points)[0] == calm


def test_no_usable_point_chooses_nothing():
    points = {Point(1e-4, 2): {"nvfp4_naive": _summary(3.0, 0.3), "bf16": _summary(2.0, 0.03, rewards=(0.5, 0.1))}}
    assert choose(points)[0] is None


def test_summarize_ignores_zero_norm_steps_and_counts_skipped_updates():
    steps = [
        {"grad_norm": g, "logprob_abs_diff": 0.1, "reward": r}
        for g, r in ((1.0, 0.0), (0.0, 0.0), (4.0, 0.5), (None, 0.5), (2.0, 1.0))
    ]
    summary = summarize({"steps": steps, "wall_seconds": 10.0})
    assert summary["grad_norm_max_over_median"] == 2.0  # max 4 over median of 1, 2, 4
    assert summary["non_finite_norms"] == 1 and summary["seconds_per_step"] == 2.0
    assert summary["reward_first_half"] == 0.0 and summary["reward_second_half"] == pytest.approx(2 / 3)


def test_a_pilot_runs_both_variants_at_every_point_and_records_its_choice(warm_start, tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(
        f"model: {{checkpoint: {warm_start}}}\n"
        "task: {name: addition, options: {digits: 3, eval_size: 16}}\n"
        "plan: {quantize: all_linear}\n"
        "sampler: {group_size: 4, groups_per_batch: 1, max_new_tokens: 6}\n"
        "trainer: {groups_per_step: 1, learning_rate: 1.0e-4, max_staleness: 1}\n"
    )
    out = tmp_path / "pilots.json"
    argv = ["--config", str(config), "--steps", "4", "--learning-rates", "1e-4", "--staleness", "1",
            "--devices", "cpu", "cpu", "--out", str(out)]  # fmt: skip
    main(argv)
    record = json.loads(out.read_text())
    assert [(p["learning_rate"], p["max_staleness"]) for p in record["points"]] == [(1e-4, 1)]
    assert all(set(p["variants"]) == {"nvfp4_naive", "bf16"} for p in record["points"])
    assert record["rule"].startswith("1. a point is *usable*") and "chosen" in record
    assert "chosen:" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:  # a record is never overwritten
        main(argv)
    assert refused.value.code == 2


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--learning-rates", "nan", "argument --learning-rates: 'nan' is not a finite number > 0"),
        ("--learning-rates", "inf", "argument --learning-rates: 'inf' is not a finite number > 0"),
        ("--learning-rates", "-inf", "argument --learning-rates: '-inf' is not a finite number > 0"),
        ("--learning-rates", "0", "argument --learning-rates: '0' is not a finite number > 0"),
        ("--learning-rates", "-1e-5", "argument --learning-rates: '-1e-5' is not a finite number > 0"),
        ("--learning-rates", "fast", "argument --learning-rates: 'fast' is not a number"),
        ("--staleness", "-1", "argument --staleness: -1 is not ≥ 0"),
        ("--staleness", "1.5", "argument --staleness: '1.5' is not an integer"),
    ],
)
def test_argparse_refuses_learning_rates_and_staleness_that_cannot_train(tmp_path, capsys, flag, value, message):
    argv = {"--config": "run.yaml", "--learning-rates": "1e-4", "--staleness": "1", "--devices": "cpu"}
    argv[flag] = value
    with pytest.raises(SystemExit) as refused:
        # flag=value: argparse would take a bare "-1e-5" for a flag
        main([*(f"{k}={v}" for k, v in argv.items()), "--out", str(tmp_path / "pilots.json")])
    assert refused.value.code == 2
    assert message in capsys.readouterr().err


@pytest.fixture
def no_pilot_runs(monkeypatch):
    """A config that loads to a CPU source without reading a model, and a pool that refuses to start."""
    import multiprocessing
    from types import SimpleNamespace

    from benchmarks.stability import pilot
    from benchmarks.stability.setting import Setting

    source = SimpleNamespace(devices=("cpu",), task=None, check_devices=lambda: None, check_model=lambda: None)
    monkeypatch.setattr(pilot, "from_config", lambda *args: (source, Setting(steps=4, eval_every=4)))

    def get_context(*args):
        raise AssertionError("a pilot started")

    monkeypatch.setattr(multiprocessing, "get_context", get_context)


@pytest.mark.parametrize("where", ["under-a-file", "unwritable-directory"])
def test_an_out_that_cannot_be_written_is_refused_before_any_pilot_runs(tmp_path, capsys, no_pilot_runs, where):
    (tmp_path / "taken").write_text("not a folder")
    out = tmp_path / "taken" / "pilots.json" if where == "under-a-file" else Path("/proc/pilots.json")
    argv = ["--config", "run.yaml", "--learning-rates", "1e-4", "--staleness", "1", "--devices", "cpu"]
    with pytest.raises(SystemExit) as refused:
        main([*argv, "--out", str(out)])
    assert refused.value.code == 2
    message = "not a file in a directory" if where == "under-a-file" else "cannot write there"
    assert f"error: --out {out}: {message}" in capsys.readouterr().err
    assert (tmp_path / "taken").read_text() == "not a folder"


def test_an_out_whose_directories_are_missing_gets_them_as_the_grid_s_does(tmp_path, no_pilot_runs):
    out = tmp_path / "new" / "deeper" / "pilots.json"
    argv = ["--config", "run.yaml", "--learning-rates", "1e-4", "--staleness", "1", "--devices", "cpu"]
    with pytest.raises(AssertionError, match="a pilot started"):
        main([*argv, "--out", str(out)])
    assert out.parent.is_dir() and list(out.parent.iterdir()) == []  # the scratch file is gone
