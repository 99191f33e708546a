"""``nibble check-contract`` through the installed console script, as a user runs it on their tensors."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.helpers import gaussian, heavy_tailed, outlier_activations

NIBBLE = str(Path(sys.executable).with_name("nibble"))


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([NIBBLE, "check-contract", *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ckpt") / "model.safetensors"
    save_file(
        {
            "layers.0.mlp.weight": gaussian((48, 256), 1) * 0.02,
            "layers.0.attn.weight": heavy_tailed((32, 128), 2).to(torch.bfloat16),
            "layers.0.act": outlier_activations(16, 512, 3),
            "experts.weight": gaussian((2, 8, 64), 4).to(torch.float16),
            "norm.weight": torch.ones(17),
            "step": torch.tensor([3], dtype=torch.int64),
            "broken": torch.tensor([[float("nan")] * 16]),
        },
        str(path),
    )
    return path


def test_every_eligible_tensor_agrees_with_te_in_every_mode(checkpoint):
    result = run(str(checkpoint), "--te")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Transformer Engine 2.20.2 reference" in result.stdout
    lines = [line for line in result.stdout.splitlines() if " vs TE: " in line]
    assert len(lines) == 4 * 6 and all(line.endswith("identical") for line in lines)
    for skipped in ("norm.weight: skipped", "step: skipped", "broken: skipped (holds NaN"):
        assert skipped in result.stdout
    assert result.stdout.rstrip().endswith("4 tensors, 0 disagreements")


def test_a_difference_is_reported_with_its_counts_and_exit_1(checkpoint, monkeypatch):
    """A quantiser one E4M3 step off in a block scale is caught: in-process, with Nibble's quantiser spoilt."""
    from typer.testing import CliRunner

    from nibble.cli import check_contract  # noqa: F401  (registers the command)
    from nibble.cli.app import app
    from nibble.kernels import contract

    real = contract.nvfp4.quantize_with_choices

    def off_by_one(x, **kwargs):
        q, choice = real(x, **kwargs)
        scales = q.block_scales.view(torch.uint8).clone()
        scales[0, 0] += 1
        return type(q)(q.codes, scales.view(torch.float8_e4m3fn), q.global_scale, q.four_over_six, q.shape), choice

    monkeypatch.setattr(contract.nvfp4, "quantize_with_choices", off_by_one)
    result = CliRunner().invoke(app, ["check-contract", str(checkpoint), "--te", "--mode", "per_token"])
    assert result.exit_code == 1, result.output
    assert "per_token vs TE: block_scales 1/" in result.output
    assert "4 tensors, 4 disagreements" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{ckpt}"], "nothing to compare against: pass --te"),
        (["{ckpt}", "--te", "--mode", "per_row"], "--mode 'per_row' is not one of"),
        (["{missing}", "--te"], "does not exist"),
        (["{ckpt}", "--te", "--te-wheel", "{missing}"], "wheel"),
        (["{ckpt}", "--te", "--te-wheel", "{ckpt}"], "not a wheel"),
        (["{empty}", "--te"], "no floating-point tensor with a last dimension divisible by 16"),
    ],
)
def test_bad_input_exits_2_naming_it(checkpoint, tmp_path, args, message):
    empty = tmp_path / "ints.safetensors"
    save_file({"ids": torch.arange(32).reshape(2, 16)}, str(empty))
    paths = {"ckpt": str(checkpoint), "missing": str(tmp_path / "nope.safetensors"), "empty": str(empty)}
    result = run(*(a.format(**paths) for a in args))
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_without_a_gpu_is_refused(checkpoint):
    result = run(str(checkpoint), "--cuda")
    assert result.returncode == 2 and "no CUDA device" in result.stderr
