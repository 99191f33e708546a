"""``nibble sft`` then ``nibble mismatch``, through the console script, as a user runs them."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

NIBBLE = str(Path(sys.executable).with_name("nibble"))


def run(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([NIBBLE, *args], capture_output=True, text=True, timeout=timeout)


def test_sft_lands_in_the_intended_accuracy_band(warm_start):
    record = json.loads((warm_start / "nibble_sft.json").read_text())
    assert 0.2 <= record["eval_accuracy"] <= 0.6, record
    assert record["task"]["name"] == "addition"
    assert 1_000_000 <= record["parameters"] <= 5_000_000
    assert (warm_start / "config.json").is_file() and (warm_start / "model.safetensors").is_file()


def test_mismatch_orders_formats_and_the_same_forward_is_exact(warm_start):
    result = run("mismatch", "--checkpoint", str(warm_start), "--prompts", "48", "--json")
    assert result.returncode == 0, result.stderr
    rows = {(r["plan"], r["trainer"]): r for r in json.loads(result.stdout)}
    same = [r for (_, trainer), r in rows.items() if trainer == "same_quantized_forward"]
    assert len(same) == 13 and all(r["logprob_abs_diff"] < 1e-4 for r in same)  # the bit-exact contract
    plain = {plan: r["logprob_abs_diff"] for (plan, trainer), r in rows.items() if trainer == "plain_bf16"}
    full = "tail15=off shared_bf16=off"
    assert plain["bf16"] < 1e-4 < plain[f"mxfp8 {full}"] < plain[f"nvfp4 {full}"]
    assert "precision plans: 13/13 plans (100%)" in result.stderr and "ETA" in result.stderr  # progress, off stdout


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_mismatch_of_a_run_configs_dense_model_has_no_shared_expert_plans(dense_run_config, device):
    result = run("mismatch", "--config", str(dense_run_config), "--device", device, "--prompts", "6", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    plans = {r["plan"] for r in rows}
    assert len(plans) == 7 and all("shared_bf16=on" not in p for p in plans)  # 1 + 3 formats × tail on/off
    same = [r for r in rows if r["trainer"] == "same_quantized_forward"]
    assert all(r["logprob_abs_diff"] < 1e-4 and r["tokens"] > 0 for r in same)  # the bit-exact contract
    plain = {r["plan"]: r["logprob_abs_diff"] for r in rows if r["trainer"] == "plain_bf16"}
    assert plain["bf16"] < 1e-4 < plain["nvfp4 tail15=off shared_bf16=off"]  # all_linear: the MLPs quantised


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["sft", "--task", "chess"], "chess"),
        (["sft", "--task-option", "digits"], "KEY=VALUE"),
        (["sft", "--task-option", "digits=99"], "digits"),
        (["sft", "--target-accuracy", "1.5"], "target_accuracy"),
        (["mismatch", "--checkpoint", "/no/such/ckpt"], "no config.json"),
        (["mismatch"], "give one of --checkpoint (a warm start) and --config (a run config)"),
        (["mismatch", "--checkpoint", "a", "--config", "b"], "give one of --checkpoint"),
        (["mismatch", "--config", "/no/such.yaml"], "/no/such.yaml"),
        (["mismatch", "--checkpoint", "/no/such", "--device", "gpu"], "--device='gpu' is not a device"),
    ],
)
def test_bad_arguments_exit_2_with_a_clear_message(args, message, tmp_path):
    if args[0] == "sft":
        args = [*args, "--out", str(tmp_path / "new")]
    result = run(*args, timeout=60)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr


def test_sft_refuses_to_overwrite_a_non_empty_directory(tmp_path):
    (tmp_path / "keep.txt").write_text("precious")
    result = run("sft", "--out", str(tmp_path), "--steps", "1")
    assert result.returncode == 2 and "refusing to overwrite" in result.stderr
    assert (tmp_path / "keep.txt").read_text() == "precious"
