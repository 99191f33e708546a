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


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["sft", "--task", "chess"], "chess"),
        (["sft", "--task-option", "digits"], "KEY=VALUE"),
        (["sft", "--task-option", "digits=99"], "digits"),
        (["sft", "--target-accuracy", "1.5"], "target_accuracy"),
        (["mismatch", "--checkpoint", "/no/such/ckpt"], "no config.json"),
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
