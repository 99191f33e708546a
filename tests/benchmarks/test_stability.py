"""A miniature of the stability grid (two variants × two seeds, a few steps) through the real sampler,
trainer and weight-sync code paths, then the report command on its JSON. It checks the harness, the
definitions and the report work together, not the scientific outcome."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.stability import VARIANTS, Setting, Source, dumps, results_document, run_grid
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
        for s in steps:  # every phase timed; the evaluation only where there was one
            assert all(s[name] > 0 for name in ("generate_seconds", "train_seconds", "publish_seconds"))
            assert (s["eval_seconds"] is None) == (s["eval_accuracy"] is None)
            assert s["eval_seconds"] is None or s["eval_seconds"] > 0
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


def test_a_run_config_gives_the_model_task_plan_scope_numbers_and_devices(warm_start, tmp_path):
    from benchmarks.stability.setting import from_config

    config = tmp_path / "run.yaml"
    config.write_text(
        f"model: {{checkpoint: {warm_start}}}\n"
        "task: {name: addition, options: {digits: 3, eval_size: 32, holdout_fraction: 0.1}}\n"
        "plan: {quantize: all_linear}\n"
        "sampler: {group_size: 4, groups_per_batch: 1, max_new_tokens: 8, temperature: 0.9}\n"
        "trainer: {groups_per_step: 2, learning_rate: 1.0e-4, max_staleness: 1, eval_every: 2, correction: mis}\n"
    )
    source, setting = from_config(config, steps=2, eval_every=None, devices=None)
    assert source.checkpoint == warm_start and source.quantize == "all_linear" and source.devices == ("cpu",)
    assert source.task == {"name": "addition", "options": {"digits": 3, "eval_size": 32, "holdout_fraction": 0.1}}
    assert (setting.steps, setting.groups_per_step, setting.group_size, setting.groups_per_batch) == (2, 2, 4, 1)
    assert (setting.max_new_tokens, setting.learning_rate, setting.max_staleness) == (8, 1e-4, 1)
    assert (setting.eval_every, setting.eval_size, setting.temperature) == (2, 32, 0.9)
    trainer = setting.trainer_config()
    assert trainer.correction == "mis" and trainer.total_steps == 2 and "device" not in setting.trainer
    assert from_config(config, 2, 5, ["cuda:0", "cuda:1"])[0].devices == ("cuda:0", "cuda:1")
    [run] = run_grid(source, ["nvfp4_token"], [0], setting)
    assert run["device"] == "cpu" and [s["step"] for s in run["steps"]] == [1, 2]


def test_dumps_writes_the_runs_once_whatever_the_parts_hold():
    run = {"variant": "bf16", "seed": 0, "steps": [{"step": 1, "reward": 0.5}]}
    document = {"benchmark": "stability", "runs": [run], "parts": [{"runs": [["bf16", 0]]}, {"runs": []}]}
    assert json.loads(dumps(document)) == document  # an empty part's list once got a copy of every run


def test_max_runs_takes_the_first_missing_runs_in_grid_order(warm_start):
    one_step = Setting(**{**TINY.__dict__, "steps": 1, "eval_every": 1})
    runs = run_grid(warm_start, ["bf16", "nvfp4_naive"], [0, 1], one_step, skip={("bf16", 0)}, max_runs=2)
    assert [(r["variant"], r["seed"]) for r in runs] == [("nvfp4_naive", 0), ("bf16", 1)]


def test_a_grid_grows_in_parts_only_with_its_own_setting(warm_start, tmp_path, capsys):
    from benchmarks.stability.__main__ import main
    from benchmarks.stability.results import earlier_part, save

    out = tmp_path / "grid.json"
    run = {"variant": "bf16", "seed": 0, "device": "cpu", "warm_start_accuracy": 0.2, "wall_seconds": 1.0,
           "steps": [{"step": 1, "grad_norm": 1.0}]}  # fmt: skip
    document = results_document([run], TINY, warm_start, "part 1", 1.0)
    save(out, {**document, "machine": {"gpu": "H200"}})
    runs, parts = earlier_part(out, results_document([], TINY, warm_start, "part 2", 0.0))
    assert runs == [run]
    assert parts == [{"command": "part 1", "machine": {"gpu": "H200"}, "wall_seconds": 1.0, "runs": [["bf16", 0]]}]
    other = Setting(**{**TINY.__dict__, "learning_rate": 1.0})
    with pytest.raises(ValueError, match=r"grid\.json: its setting\.learning_rate is 0\.0003, this grid's is 1\.0"):
        earlier_part(out, results_document([], other, warm_start, "part 2", 0.0))
    for junk in ("[1, 2]", '{"runs": 5}', '{"runs": [{"foo": 1}]}'):
        (tmp_path / "junk.json").write_text(junk)
        with pytest.raises(ValueError, match=r"junk\.json: not a stability results file"):
            earlier_part(tmp_path / "junk.json", document)
    before = out.read_text()
    refused = [
        ["--checkpoint", str(warm_start), "--out", str(out), "--steps", "1"],  # never overwritten
        ["--checkpoint", str(warm_start), "--out", str(tmp_path / "n.json"), "--devices", "gpu7"],
        ["--checkpoint", str(warm_start), "--out", str(tmp_path / "n.json"), "--devices", "cuda:7"],
        ["--checkpoint", str(tmp_path), "--out", str(tmp_path / "n.json")],  # not empty, not a model: kept
        ["--checkpoint", str(warm_start), "--out", str(out / "sub.json")],
        ["--checkpoint", str(warm_start), "--out", str(tmp_path / "n.json"), "--max-runs", "0"],
        ["--checkpoint", str(warm_start), "--out", str(tmp_path / "n.json"), "--steps", "ten"],
    ]
    for argv in refused:
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2, argv
    assert "argument --steps: 'ten' is not an integer" in capsys.readouterr().err
    assert out.read_text() == before and not (tmp_path / "n.json").exists()


def test_settings_that_cannot_run_as_recorded_are_refused():
    with pytest.raises(ValueError, match="groups_per_step=4 is not a multiple of groups_per_batch=3"):
        Setting(groups_per_step=4, groups_per_batch=3)
    with pytest.raises(ValueError, match="eval_every=0 must be"):
        Setting(eval_every=0)


def test_the_cpu_grid_recorded_before_plan_scope_trainer_and_step_times_still_takes_parts(tmp_path):
    from benchmarks.stability.results import ROOT, earlier_part

    old = json.loads((ROOT / "benchmarks" / "results" / "stability.json").read_text())
    assert "quantize" not in old and "trainer" not in old["setting"]  # written before those fields existed
    assert "generate_seconds" not in old["runs"][0]["steps"][0]
    setting = Setting(**old["setting"])
    source = ROOT / "runs" / "warm_start"
    runs, parts = earlier_part(ROOT / "benchmarks" / "results" / "stability.json",
                               results_document([], setting, source, "part 2", 0.0))  # fmt: skip
    assert len(runs) == 50 and parts[0]["command"] == old["command"]
    copied = tmp_path / "stability.json"
    copied.write_text(json.dumps(old))
    others = (Setting(**{**old["setting"], "steps": 150}), Setting(**old["setting"], trainer={"correction": "mis"}))
    for other in others:
        with pytest.raises(ValueError, match=r"stability\.json: its setting\.(steps|trainer) is"):
            earlier_part(copied, results_document([], other, source, "part 2", 0.0))
    with pytest.raises(ValueError, match=r"its quantize is 'experts', this grid's is 'all_linear'"):
        earlier_part(copied, results_document([], setting, Source(source, quantize="all_linear"), "part 2", 0.0))


def test_the_command_records_step_times_that_calibrate_the_simulator(warm_start, tmp_path, capsys):
    from benchmarks.stability.__main__ import main
    from nibble.simulator import load

    out = tmp_path / "grid.json"
    common = ["--checkpoint", str(warm_start), "--variants", "bf16", "--steps", "2", "--eval-every", "2"]
    main([*common, "--seeds", "0", "--out", str(out)])
    main([*common, "--seeds", "0", "1", "--append", "--out", str(out)])  # adds seed 1 only
    assert capsys.readouterr().out.count("s/step gen") == 2
    before = out.read_bytes()
    main([*common, "--seeds", "1", "0", "--append", "--out", str(out)])  # nothing missing: the record untouched
    assert "nothing to run" in capsys.readouterr().out
    assert out.read_bytes() == before
    record = json.loads(out.read_text())
    runs = record["runs"]
    assert [(r["variant"], r["seed"]) for r in runs] == [("bf16", 0), ("bf16", 1)]
    # each part says where weight-sync quantised (publish_seconds depend on it)
    assert [p["machine"]["publish_quantize"] for p in record["parts"]] == ["on the run's device"] * 2
    steps = [s for r in runs for s in r["steps"]]
    calibration = load([out])
    assert calibration.rollout_seconds["bf16"] == pytest.approx(sum(s["generate_seconds"] for s in steps) / 4)
    assert calibration.train_seconds["bf16"] == pytest.approx(sum(s["train_seconds"] for s in steps) / 4)


def test_appending_to_the_pilots_file_names_it_instead_of_a_key_error(tmp_path, capsys):
    from benchmarks.stability.__main__ import main
    from benchmarks.stability.results import ROOT

    pilots = tmp_path / "pilots.json"
    pilots.write_text((ROOT / "benchmarks" / "results" / "stability_smollm2_pilots.json").read_text())
    before = pilots.read_text()
    with pytest.raises(SystemExit) as exited:
        main(["--checkpoint", str(tmp_path / "unused"), "--steps", "1", "--append", "--out", str(pilots)])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "KeyError" not in err
    assert f"error: {pilots}: a stability pilots file (benchmarks/stability/pilot.py)" in err
    assert pilots.read_text() == before


def test_appending_refuses_runs_that_are_no_list_of_named_runs_before_any_run_starts(tmp_path):
    """``"runs": {}`` passed the check (an empty dict iterates like an empty list) and the grid ran every run,
    to fail saving the first (``dict + list``: a traceback, the run lost); a variant or seed of the wrong
    type failed as a traceback (``unhashable type: 'list'``) building the set of runs to skip."""
    from benchmarks.stability.results import ROOT, earlier_part

    recorded = json.loads((ROOT / "benchmarks" / "results" / "stability_smollm2.json").read_text())
    document = {key: recorded[key] for key in ("checkpoint", "task", "quantize", "setting")}
    run = {"seed": 0, "steps": []}
    bad = [
        {**run, "variant": ["bf16"]},
        {**run, "variant": "bf16", "seed": "0"},
        {**run, "variant": "bf16", "seed": True},
    ]
    for runs in ({}, {"a": 1}, *([r] for r in bad), [{"variant": "bf16", "seed": 0, "steps": {}}]):
        out = tmp_path / "grid.json"
        out.write_text(json.dumps({**recorded, "runs": runs}))
        with pytest.raises(ValueError, match=r"grid\.json: not a stability results file"):
            earlier_part(out, document)
