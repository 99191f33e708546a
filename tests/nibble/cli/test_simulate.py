"""``nibble simulate`` through the installed console script, as a user runs it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

NIBBLE = str(Path(sys.executable).with_name("nibble"))


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([NIBBLE, "simulate", *args], capture_output=True, text=True, timeout=300)


def test_json_run_writes_result_png_and_page(tmp_path):
    result = run("--steps", "40", "--max-staleness", "2", "--horizon", "short", "--out", str(tmp_path), "--json")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["config"]["max_staleness"] == 2 and record["config"]["horizon"] == "short"
    summary = record["summary"]
    for key in ("steps", "speed_vs_sync_bf16", "trainer_utilisation", "discards", "mean_staleness", "grad_spikes",
                "final_drift", "verdict", "critical_mismatch", "precision_floor"):  # fmt: skip
        assert key in summary
    assert summary["steps"] == 40 and summary["verdict"] in ("stable", "will_diverge", "diverged")
    assert (tmp_path / "simulation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "NibbleModel" in (tmp_path / "simulation.html").read_text()
    saved = json.loads((tmp_path / "result.json").read_text())
    assert len(saved["curves"]["drift"]) == 40 and set(saved["ghosts"]) == {"bf16", "mxfp8"}


def test_table_output_with_a_calibration_says_where_numbers_came_from(tmp_path):
    measured = tmp_path / "mismatch.json"
    measured.write_text(json.dumps({"source": "tiny run", "floors": {"nvfp4_4o6": 0.029}}))
    result = run("--steps", "20", "--out", str(tmp_path / "out"), "--calibrate", str(measured))
    assert result.returncode == 0, result.stderr
    assert "verdict" in result.stdout and "inputs and where they came from" in result.stdout
    assert "tiny run" in result.stdout and "published" in result.stdout


def test_optimize_prints_the_frontier_best_first(tmp_path):
    args = ("--optimize", "--steps", "30", "--seeds", "1", "--max-samplers", "2", "--out", str(tmp_path))
    result = run(*args, "--json")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["searched"] == 25 * 9 * 2 and record["frontier"]
    speeds = [row["speed_vs_sync_bf16"] for row in record["frontier"]]
    assert speeds == sorted(speeds, reverse=True)
    assert (tmp_path / "frontier.md").read_text().startswith("| # | precision |")
    table = run(*args, "--top", "3")
    assert table.returncode == 0 and "frontier, best first" in table.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-staleness", "9"], "max_staleness=9 is outside 0..8 (--max-staleness)"),
        (["--precision", "fp8"], "precision='fp8' is not one of bf16, mxfp8, nvfp4"),
        (["--batch", "5"], "batch=5 is not one of 4, 8, 16 (--batch)"),
        (["--horizon", "forever"], "horizon='forever' is not one of short, medium, long"),
        (["--num-samplers", "0"], "num_samplers=0 is outside 1..64"),
        (["--calibrate", "/no/such/mismatch.json"], "/no/such/mismatch.json: no such file or directory"),
    ],
)
def test_bad_knobs_exit_2_with_a_clear_message(args, message, tmp_path):
    result = run(*args, "--out", str(tmp_path))
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def test_a_bad_calibration_file_names_the_file_and_field(tmp_path):
    bad = tmp_path / "mismatch.json"
    bad.write_text(json.dumps({"floors": {"nvfp4": "small"}}))
    result = run("--calibrate", str(bad), "--out", str(tmp_path))
    assert result.returncode == 2
    assert f"{bad}: field 'floors.nvfp4' must be a number in [0, 1]" in result.stderr


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            {"benchmark": "stability_pilots", "points": [], "chosen": None},
            "a stability pilots file (benchmarks/stability/pilot.py), not a stability or mismatch results file",
        ),
        ({"benchmark": "throughput", "seconds": 3}, "the 'throughput' benchmark's record, not a stability or mismatch"),
        ({"floors": {"nvfp4": 10**400}}, "field 'floors.nvfp4' must be a number in [0, 1]"),  # past the float range
    ],
)
def test_a_file_of_another_benchmark_or_an_overflowing_number_exits_2_naming_it(tmp_path, content, message):
    path = tmp_path / "file.json"
    path.write_text(json.dumps(content))
    result = run("--calibrate", str(path), "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{path}: {message}" in result.stderr, result.stderr


def test_calibrate_refuses_a_stability_grid_repeating_a_run(tmp_path):
    step = {"step": 1, "generate_seconds": 2.0, "train_seconds": 0.5, "publish_seconds": 0.1, "eval_seconds": None}
    grid = {
        "benchmark": "stability", "variants": {"bf16": {"format": "bf16"}},
        "runs": [{"variant": "bf16", "seed": 0, "steps": [step]}, {"variant": "bf16", "seed": 0, "steps": [step]}],
    }  # fmt: skip
    path = tmp_path / "stability.json"
    path.write_text(json.dumps(grid))
    result = run("--calibrate", str(path), "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{path}: runs[1] (variant 'bf16', seed 0) repeats runs[0]" in result.stderr, result.stderr


@pytest.mark.parametrize("optimize", [False, True], ids=["run", "optimize"])
@pytest.mark.parametrize("where", ["a-file", "under-a-file"])
def test_an_out_that_is_a_file_or_cannot_be_made_exits_2_before_any_work(tmp_path, where, optimize):
    (tmp_path / "taken").write_text("not a folder")
    out = tmp_path / "taken" if where == "a-file" else tmp_path / "taken" / "sub"
    result = run("--out", str(out), *(["--optimize", "--seeds", "1", "--max-samplers", "1"] if optimize else []))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    message = f"--out {out} is a file, not a folder" if where == "a-file" else f"--out {out}: cannot write there"
    assert message in result.stderr
    assert (tmp_path / "taken").read_text() == "not a folder"


def test_optimize_checks_out_before_it_searches(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import nibble.cli.simulate  # noqa: F401  (registers the sub-command)
    from nibble.cli.app import app
    from nibble.simulator import optimize

    def search(*args, **kwargs):
        raise AssertionError("searched before checking --out")

    monkeypatch.setattr(optimize, "search", search)
    (tmp_path / "taken").write_text("")
    result = CliRunner().invoke(app, ["simulate", "--optimize", "--out", str(tmp_path / "taken")])
    assert result.exit_code == 2 and "is a file, not a folder" in result.output, result.output
    (tmp_path / "out" / "frontier.json").mkdir(parents=True)  # a folder where a file goes
    result = CliRunner().invoke(app, ["simulate", "--optimize", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "frontier.json is in the way (not a file)" in result.output, result.output


def test_calibrate_reads_what_nibble_mismatch_writes_and_names_the_rows(tmp_path):
    benchmark = Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "mismatch.json"
    printed = tmp_path / "rows.json"  # `nibble mismatch --json` prints the rows alone
    printed.write_text(json.dumps(json.loads(benchmark.read_text())["rows"]))
    for path in (benchmark, printed):
        result = run("--steps", "20", "--precision", "bf16", "--max-staleness", "0", "--out", str(tmp_path / "out"),
                     "--calibrate", str(path))  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert f"floors.bf16 = 0  <- {path}" in result.stdout
        assert "rows[21] (plan 'nvfp4+4/6 tail15=on shared_bf16=off', trainer plain_bf16" in result.stdout


def test_calibrated_floors_below_bf16_s_are_clamped_not_a_crash(tmp_path):
    low = tmp_path / "low.json"
    low.write_text(json.dumps({"floors": {"bf16": 0.5, "nvfp4_4o6": 0.01}}))
    args = ("--optimize", "--steps", "10", "--seeds", "1", "--max-samplers", "1", "--out", str(tmp_path))
    result = run(*args, "--calibrate", str(low))
    assert result.returncode == 0, result.stderr
    assert "clamped from 0.01 to floors.bf16 = 0.5" in result.stdout
    assert "no configuration is stable on every seed" in result.stdout


def _timed_grid(tmp_path, times: dict[str, tuple[float, float, float]], steps: int = 1) -> Path:
    """A stability grid's file on an H200 with ``steps`` timed steps per variant of ``times``: its generate,
    train and publish seconds."""
    grid = {
        "benchmark": "stability", "machine": {"gpu": "NVIDIA H200"},
        "variants": {"bf16": {"format": "bf16"}, "nvfp4_naive": {
            "format": "nvfp4", "activation_scale": "per_tensor", "four_over_six": None, "backward": "high_precision",
            "bf16_last_fraction": 0.0, "bf16_shared_experts": False}},
        "runs": [{"variant": v, "seed": 0, "steps": [
            {"step": i, "generate_seconds": g, "train_seconds": t, "publish_seconds": p, "eval_seconds": None}
            for i in range(1, steps + 1)]} for v, (g, t, p) in times.items()],
    }  # fmt: skip
    path = tmp_path / "stability.json"
    path.write_text(json.dumps(grid))
    return path


def test_calibrate_takes_step_times_from_a_stability_grid(tmp_path):
    path = _timed_grid(tmp_path, {"bf16": (2.0, 0.5, 0.1), "nvfp4_naive": (1.5, 0.5, 0.1)})
    result = run("--steps", "20", "--out", str(tmp_path / "out"), "--calibrate", str(path), "--json")
    assert result.returncode == 0, result.stderr
    calibration = json.loads(result.stdout)["calibration"]
    assert calibration["rollout_seconds"]["bf16"] == 2.0 and calibration["rollout_seconds"]["nvfp4"] == 1.5
    assert calibration["train_seconds"]["nvfp4_high_precision"] == 0.5
    # the --json record carries a pause per format: the file's for its formats, the published one for the rest
    assert calibration["weight_sync_seconds"] == {"bf16": 0.1, "mxfp8": 5.0, "nvfp4": 0.1, "nvfp4_4o6": 5.0}
    assert "stability grid on NVIDIA H200" in calibration["sources"]["rollout.nvfp4"]
    assert calibration["floors"]["nvfp4"] == 0.0328  # never from a stability file


# The H200 grid's means (benchmarks/results/stability_smollm2.json): generate, train, publish seconds per step.
H200_BF16, H200_NVFP4 = (1.53, 0.44, 0.16), (2.07, 0.53, 1.13)
NAIVE = ("--no-four-over-six", "--no-dequantized-backward", "--no-bf16-last-15", "--no-bf16-shared-experts")


def test_async_nvfp4_against_sync_bf16_runs_each_plan_on_its_own_pause(tmp_path):
    from nibble.simulator import SimConfig
    from nibble.simulator.timeline import build_timeline

    path = _timed_grid(tmp_path, {"bf16": H200_BF16, "nvfp4_naive": H200_NVFP4}, steps=3)
    result = run("--steps", "20", "--out", str(tmp_path / "out"), "--calibrate", str(path), *NAIVE, "--json")
    assert result.returncode == 0 and "warning" not in result.stderr, result.stderr
    summary = json.loads(result.stdout)["summary"]
    naive = SimConfig(precision="nvfp4", four_over_six=False, dequantized_backward=False, bf16_last_15=False,
                      bf16_shared_experts=False, steps=20)  # fmt: skip
    # Synchronous BF16 with a sampler per group: every step after the first starts with every sampler
    # swapping at once for BF16's own 0.16 s, so the pauses add 19 · 0.16 s to the run without them.
    sync = naive.with_(precision="bf16", max_staleness=0)
    baseline = build_timeline(sync.with_(weight_sync=False), *H200_BF16[:2], 0.16).end_time + 19 * 0.16
    assert summary["sync_bf16_wall_clock_seconds"] == pytest.approx(baseline)
    # ... and NVFP4 on its own 1.13 s: slower than synchronous BF16, where one pooled pause made it faster
    expected = baseline / build_timeline(naive, *H200_NVFP4).end_time
    pooled_bf16, pooled_nvfp4 = (*H200_BF16[:2], 0.645), (*H200_NVFP4[:2], 0.645)  # the mean of both runs' pauses
    pooled = build_timeline(sync, *pooled_bf16).end_time / build_timeline(naive, *pooled_nvfp4).end_time
    assert summary["speed_vs_sync_bf16"] == pytest.approx(expected)
    assert expected < 1 < pooled


def test_a_speed_up_from_measured_and_published_step_times_is_flagged(tmp_path):
    path = _timed_grid(tmp_path, {"bf16": (2.0, 0.5, 0.1), "nvfp4_naive": (2.0, 0.5, 0.1)})
    # The default plan (four-over-six, dequantised backward) was not measured: its times stay published.
    result = run("--steps", "20", "--out", str(tmp_path / "a"), "--calibrate", str(path))
    assert result.returncode == 0, result.stderr
    assert "no speed-up" in result.stderr
    assert "rollout.nvfp4_4o6 (published" in result.stderr and "rollout.bf16 (" + str(path) in result.stderr
    # The measured plan: every time it uses came from the file.
    naive = ("--no-four-over-six", "--no-dequantized-backward")
    result = run("--steps", "20", "--out", str(tmp_path / "b"), "--calibrate", str(path), *naive)
    assert result.returncode == 0 and "warning" not in result.stderr
    # the file timed bf16 and naive NVFP4: the other formats' pauses stay as they were, and it says so
    assert "weight_sync.bf16 = 0.1  <- " + str(path) in result.stdout
    assert "weight_sync.mxfp8, weight_sync.nvfp4_4o6 = 5 s: illustrative" in result.stdout
    assert "(kept: no calibration file timed a run of the plan each is measured under)" in result.stdout
    assert "warning" not in run("--steps", "20", "--out", str(tmp_path / "c")).stderr
    # --json records the mix as well as warning; --optimize compares every plan, so any mix is flagged
    result = run("--steps", "20", "--out", str(tmp_path / "d"), "--calibrate", str(path), "--json")
    assert any(m.startswith("rollout.nvfp4_4o6 (published") for m in json.loads(result.stdout)["mixed_step_times"])
    assert "no speed-up" in result.stderr
    args = ("--optimize", "--steps", "10", "--seeds", "1", "--max-samplers", "1", "--out", str(tmp_path / "e"))
    result = run(*args, "--calibrate", str(path))
    assert result.returncode == 0 and "warning: the frontier's speed-ups" in result.stderr
    assert json.loads((tmp_path / "e" / "frontier.json").read_text())["mixed_step_times"]
