"""``nibble report stability`` through the installed console script: table, plots, and bad input."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

NIBBLE = str(Path(sys.executable).with_name("nibble"))
PNG = b"\x89PNG\r\n\x1a\n"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([NIBBLE, "report", "stability", *args], capture_output=True, text=True, timeout=120)


def step(i: int, norm: float | None = 1.0, acc: float | None = None) -> dict:
    return {
        "step": i,
        "grad_norm": norm,
        "reward": 0.25,
        "eval_accuracy": acc,
        "logprob_abs_diff": 0.02,
        "fresh_logprob_abs_diff": 0.01 if i % 2 else None,
        "skipped_updates": 0 if norm is not None and math.isfinite(norm) else 1,
    }


def results(tmp_path: Path) -> Path:
    """Two variants × two seeds: ``calm`` never spikes; ``wild`` spikes at step 25 (seed 0) and collapses."""
    calm = [step(i, 1.0, 0.3 if i % 10 == 0 else None) for i in range(1, 51)]
    wild = [step(i, 50.0 if i == 25 else 1.0, (0.0 if i >= 20 else 0.3) if i % 10 == 0 else None) for i in range(1, 51)]
    runs = [
        {"variant": "calm", "seed": 0, "warm_start_accuracy": 0.25, "steps": calm},
        {"variant": "calm", "seed": 1, "warm_start_accuracy": 0.25, "steps": calm},
        {"variant": "wild", "seed": 0, "warm_start_accuracy": 0.25, "steps": wild},
        {"variant": "wild", "seed": 1, "warm_start_accuracy": 0.25, "steps": calm},
    ]
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"benchmark": "stability", "runs": runs}))
    return path


def test_writes_the_table_and_three_plots(tmp_path):
    out = tmp_path / "report"
    result = run(str(results(tmp_path)), "--out", str(out))
    assert result.returncode == 0, result.stderr
    table = (out / "table.md").read_text().splitlines()
    assert table[0].startswith("| variant | seeds | spikes / 100 steps | collapses |")
    assert "| mean \\|Δlogprob\\| |" in table[0]  # escaped: the pipes are not column edges
    calm, wild = table[2].split(" | "), table[3].split(" | ")
    assert calm[0] == "| calm" and calm[2] == "0.00 ± 0.00" and calm[3] == "0/2"
    # one spike in 45 judged steps on seed 0, none on seed 1; seed 0 collapsed at step 20
    assert wild[2] == f"{100 / 45 / 2:.2f} ± {math.sqrt(2) * 100 / 45 / 2:.2f}" and wild[3] == "1/2"
    assert calm[4] == "0/2" and wild[4] == "1/2"  # seed 0 of wild ends at 0.0, below 0.25 - 0.1
    assert "calm" in result.stdout and "wild" in result.stdout
    # the article's claims name the grid's variants: none of them ran here, and each claim says so
    claims = (out / "claims.md").read_text().splitlines()
    assert claims[0].startswith("| claim | verdict (Welch") and len(claims) == 2 + 8
    assert all("| not run | no run of " in line for line in claims[2:])
    # these steps record no staleness: the mismatch-by-staleness table has its rows, without numbers
    staleness = (out / "staleness.md").read_text().splitlines()
    assert staleness[-2:] == ["| calm | — | — | — | — |", "| wild | — | — | — | — |"]
    for name in ("grad_norm.png", "reward.png", "accuracy.png"):
        assert (out / name).read_bytes()[:8] == PNG


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "results file not found"),
        ("{not json", "malformed JSON"),
        ('{"runs": [{"variant": "a", "variant": "b"}]}', "key 'variant' appears twice in the object with keys variant"),
        ("[]", "'runs' list"),
        ('{"runs": []}', "'runs' must be a non-empty list"),
        ('{"runs": [{"variant": "a", "seed": 0, "steps": []}]}', "runs[0]: missing field 'warm_start_accuracy'"),
        (
            '{"runs": [{"variant": "a", "seed": 0, "warm_start_accuracy": 0.2, "steps": [{"step": 1}]}]}',
            "runs[0].steps[0]: missing field 'grad_norm'",
        ),
        (
            '{"runs": [{"variant": "a", "seed": "zero", "warm_start_accuracy": 0.2, "steps": []}]}',
            "runs[0].seed = 'zero': expected an integer",
        ),
        (
            '{"runs": [{"variant": "a", "seed": 0, "warm_start_accuracy": 0.2, "steps": [{"step": 1, "grad_norm": 1, '
            '"reward": 0, "eval_accuracy": null, "logprob_abs_diff": 0, "fresh_logprob_abs_diff": null, '
            '"skipped_updates": 0, "generate_seconds": "slow"}]}]}',
            "runs[0].steps[0].generate_seconds = 'slow': expected a number",
        ),
    ],
)
def test_bad_input_exits_2_naming_the_file_and_field_without_a_traceback(tmp_path, content, message):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    result = run(str(path), "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert str(path) in result.stderr and message in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()  # nothing written for bad input


def test_an_out_that_is_a_file_is_refused(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run(str(results(tmp_path)), "--out", str(blocker))
    assert result.returncode == 2 and "--out" in result.stderr and "Traceback" not in result.stderr


def test_simulate_sets_the_model_beside_the_cpu_grid(tmp_path):
    grid = Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "stability.json"
    out = tmp_path / "report"
    result = run(str(grid), "--out", str(out), "--simulate")
    assert result.returncode == 0, result.stderr
    table = (out / "simulate.md").read_text().splitlines()
    assert table[0].startswith("| variant | seeds | spikes/100: model (law) | measured | collapses: model |")
    assert len([line for line in table if line.startswith("| ") and not line.startswith("| variant")]) == 10
    assert "floors.nvfp4 = 0.0328  <- published" in result.stdout  # a file without step times: the article's


def test_simulate_refuses_a_file_it_cannot_map_and_calibrate_alone(tmp_path):
    path = results(tmp_path)  # no 'variants', no staleness
    result = run(str(path), "--out", str(tmp_path / "out"), "--simulate")
    assert result.returncode == 2
    assert f"{path}: runs[0]: variant 'calm' is not in the file's 'variants'" in result.stderr
    result = run(str(path), "--out", str(tmp_path / "out"), "--calibrate", str(path))
    assert result.returncode == 2 and "--calibrate is for --simulate" in result.stderr
    assert not (tmp_path / "out").exists()


def _nonsense(data: dict, case: str) -> dict:
    """``results``' file made nonsense one way (``case``)."""
    runs = data["runs"]
    if case == "nan-reward":
        runs[2]["steps"] = [dict(s) for s in runs[2]["steps"]]
        runs[2]["steps"][4]["reward"] = math.nan
    elif case == "repeated-run":
        runs[3]["seed"] = 0
    elif case == "steps-out-of-order":
        runs[1]["steps"] = [runs[1]["steps"][1], runs[1]["steps"][0], *runs[1]["steps"][2:]]
    elif case == "pilots":
        return {"benchmark": "stability_pilots", "points": [], "chosen": None}
    return data


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("nan-reward", "runs[2] (variant 'wild', seed 0), steps[4] (step 5): reward = nan: expected a finite number"),
        ("repeated-run", "runs[3] (variant 'wild', seed 0) repeats runs[2]: one run per variant and seed"),
        ("steps-out-of-order", "runs[1] (variant 'calm', seed 1), steps[1] (step 1): step 1 comes after step 2"),
        ("pilots", "a stability pilots file (benchmarks/stability/pilot.py"),
    ],
)
def test_nonsense_numbers_exit_2_naming_the_file_run_and_step(tmp_path, case, message):
    path = results(tmp_path)
    path.write_text(json.dumps(_nonsense(json.loads(path.read_text()), case)))
    result = run(str(path), "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"error: {path}: " in result.stderr and message in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()


def test_simulate_refuses_a_staleness_whose_cost_overflows(tmp_path):
    path = results(tmp_path)
    data = json.loads(path.read_text())
    data["variants"] = {"calm": {"format": "bf16"}, "wild": {"format": "nvfp4"}}
    for r in data["runs"]:
        r["steps"] = [{**s, "staleness_mean": 1e300 if s["step"] == 7 else 1.0} for s in r["steps"]]
    path.write_text(json.dumps(data))
    result = run(str(path), "--out", str(tmp_path / "out"), "--simulate")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{path}: runs[0].steps[6].staleness_mean = 1e+300 (variant 'calm', seed 0, step 7)" in result.stderr


def _timed_results(tmp_path: Path, seconds: dict[str, tuple[float, float, float]]) -> Path:
    """One 20-step run per variant of ``seconds`` (generate, train, publish seconds per step), staleness 1."""
    from benchmarks.stability.variants import VARIANTS

    runs = []
    for variant, (g, t, p) in seconds.items():
        steps = [{**step(i, 1.0, 0.3 if i % 10 == 0 else None), "staleness_mean": 1.0, "generate_seconds": g,
                  "train_seconds": t, "publish_seconds": p, "eval_seconds": None} for i in range(1, 21)]  # fmt: skip
        runs.append({"variant": variant, "seed": 0, "warm_start_accuracy": 0.25, "steps": steps})
    path = tmp_path / "timed.json"
    data = {"benchmark": "stability", "variants": {v: VARIANTS[v] for v in seconds}, "runs": runs}
    path.write_text(json.dumps(data))
    return path


def test_simulate_gives_each_plan_s_speed_up_on_its_own_weight_sync_pause(tmp_path):
    from nibble.simulator import SimConfig
    from nibble.simulator.timeline import build_timeline

    path = _timed_results(tmp_path, {"bf16": (1.53, 0.44, 0.16), "nvfp4_naive": (2.07, 0.53, 1.13)})
    result = run(str(path), "--out", str(tmp_path / "out"), "--simulate")
    assert result.returncode == 0, result.stderr
    # nibble simulate's default workload (200 steps, max_staleness 1) with the naive plan, each side on its own
    # format's seconds: NVFP4 swaps for 1.13 s, the synchronous BF16 baseline for 0.16 s
    naive = SimConfig(precision="nvfp4", four_over_six=False, dequantized_backward=False, bf16_last_15=False,
                      bf16_shared_experts=False)  # fmt: skip
    sync = naive.with_(precision="bf16", max_staleness=0)
    expected = build_timeline(sync, 1.53, 0.44, 0.16).end_time / build_timeline(naive, 2.07, 0.53, 1.13).end_time
    pooled = build_timeline(sync, 1.53, 0.44, 0.645).end_time / build_timeline(naive, 2.07, 0.53, 0.645).end_time
    assert f"{expected:.2f}" != f"{pooled:.2f}"
    rows = [line.split(" | ") for line in (tmp_path / "out" / "simulate.md").read_text().splitlines()]
    speeds = {cells[0].lstrip("| "): cells[1] for cells in rows if len(cells) == 7 and cells[1][0].isdigit()}
    assert speeds["nvfp4_naive"] == f"{expected:.2f}" and set(speeds) == {"bf16", "nvfp4_naive"}
    assert "- none skipped" in (tmp_path / "out" / "simulate.md").read_text()


def test_simulate_reports_a_file_without_bf16_or_naive_nvfp4_times_and_says_what_it_skipped(tmp_path):
    # as benchmarks/results/h200_stability_smollm2_token_smoke.json: only nvfp4_token and recipe ran
    path = _timed_results(tmp_path, {"nvfp4_token": (2.0, 0.5, 1.0), "recipe": (2.2, 0.6, 1.2)})
    result = run(str(path), "--out", str(tmp_path / "out"), "--simulate")
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "out" / "simulate.md").read_text()
    assert "| nvfp4_token | 1 |" in text and "| recipe | 1 |" in text  # the model against the runs: still there
    why = f"skipped: every variant: {path}: holds no number to calibrate from (its timed variants (nvfp4_token, recipe)"
    assert f"- {why}" in text and f"speed vs synchronous BF16 {why}" in result.stdout.replace("\n", " ")
