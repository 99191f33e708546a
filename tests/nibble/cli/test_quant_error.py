"""``nibble quant-error`` through the installed console script, as a user runs it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

NIBBLE = str(Path(sys.executable).with_name("nibble"))


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([NIBBLE, "quant-error", *args], capture_output=True, text=True, timeout=300)


def test_json_report_on_synthetic_and_real_weights():
    result = run("--rows", "64", "--cols", "512", "--weights", "minilm", "--json")
    assert result.returncode == 0, result.stderr
    cells = {(c["source"], c["format"]): c for c in json.loads(result.stdout)}
    sources = {s for s, _ in cells}
    assert sources == {"gaussian", "student_t3", "minilm_l6"}
    for source in sources:
        plain = cells[source, "nvfp4_per_tensor"]["rel_mse"]
        assert cells[source, "mxfp8_rceil"]["rel_mse"] < cells[source, "nvfp4_4o6_mse"]["rel_mse"] < plain
        assert 0 < cells[source, "nvfp4_4o6_mse"]["map_to_4_fraction"] < 1
        assert cells[source, "nvfp4_per_token"]["map_to_4_fraction"] is None
    assert cells["minilm_l6", "nvfp4_per_tensor"]["elements"] > 10_000_000


def test_table_output_names_every_format():
    result = run("--rows", "32", "--cols", "256")
    assert result.returncode == 0, result.stderr
    for name in ("nvfp4_per_tensor", "nvfp4_per_token", "nvfp4_4o6_mse", "nvfp4_4o6_mae", "mxfp8_rceil"):
        assert name in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--weights", "/no/such/dir"], "/no/such/dir: no such file or directory"),
        (["--cols", "100"], "--cols 100 is not a multiple of 32"),
    ],
)
def test_bad_arguments_exit_2_with_a_clear_message(args, message):
    result = run(*args)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def test_a_file_that_is_not_safetensors_is_named(tmp_path):
    bogus = tmp_path / "model.safetensors"
    bogus.write_bytes(b"definitely not a safetensors header")
    result = run("--weights", str(bogus))
    assert result.returncode == 2
    assert str(bogus) in result.stderr and "not a readable safetensors file" in result.stderr


def test_a_directory_without_matrices_is_rejected(tmp_path):
    import torch
    from safetensors.torch import save_file

    save_file({"norm.weight": torch.ones(48)}, str(tmp_path / "model.safetensors"))
    result = run("--weights", str(tmp_path))
    assert result.returncode == 2 and "no floating-point matrix" in result.stderr


def test_bad_weights_are_reported_by_tensor_name_and_skips_are_counted(tmp_path):
    import torch
    from safetensors.torch import save_file

    good = torch.randn(8, 64)
    bad = torch.randn(8, 64)
    bad[1, 3] = float("nan")
    save_file({"norm.weight": torch.ones(64), "good.weight": good}, str(tmp_path / "a.safetensors"))
    result = run("--rows", "16", "--cols", "64", "--weights", str(tmp_path / "a.safetensors"), "--json")
    assert result.returncode == 0, result.stderr
    cells = [c for c in json.loads(result.stdout) if c["source"] == "weights:a.safetensors"]
    assert cells and all(c["skipped_tensors"] == 1 for c in cells)
    save_file({"bad.weight": bad}, str(tmp_path / "b.safetensors"))
    result = run("--rows", "16", "--cols", "64", "--weights", str(tmp_path / "b.safetensors"))
    assert result.returncode == 2 and "tensor bad.weight holds NaN" in result.stderr


def test_absurd_sizes_are_refused_before_allocating():
    result = run("--rows", "100000000000", "--cols", "4096")
    assert result.returncode == 2 and "at most" in result.stderr and "Traceback" not in result.stderr
