"""benchmarks/options.py: a list option given twice adds up, a value given twice is refused, and its default stands
only when it is never given; the count and fraction types refuse what is out of range. And the benchmark CLIs
refuse bad values before they look for a GPU or start training."""

import argparse
import sys

import pytest

from benchmarks import async_speedup, gpu_main_job, kernels_gpu, sampler_gpu
from benchmarks.options import AddUp, fraction, non_negative, positive


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--tiles", type=int, action=AddUp, default=[7, 8])
    parser.add_argument("--skip", action=AddUp, choices=["dense", "grouped"], default=[])
    return parser


def test_uses_add_up_and_the_default_stands_alone():
    parser = _parser()
    assert parser.parse_args([]).tiles == [7, 8]
    assert parser.parse_args(["--tiles", "1", "2"]).tiles == [1, 2]
    assert parser.parse_args(["--tiles", "1", "--tiles", "2", "3"]).tiles == [1, 2, 3]
    assert parser.parse_args(["--skip", "dense", "--skip", "grouped"]).skip == ["dense", "grouped"]
    assert _parser().parse_args([]).tiles == [7, 8]  # the default list itself is never extended


def test_a_use_without_values_or_with_a_bad_one_is_refused():
    with pytest.raises(argparse.ArgumentError, match="expected at least one argument"):
        _parser().parse_args(["--tiles"])
    with pytest.raises(argparse.ArgumentError, match="invalid choice"):
        _parser().parse_args(["--skip", "moe"])
    with pytest.raises(ValueError, match="nargs='\\+'"):
        argparse.ArgumentParser().add_argument("--x", action=AddUp, nargs="*")


def test_a_value_given_twice_is_refused_in_one_use_or_across_two():
    for argv in (["--tiles", "1", "1"], ["--tiles", "1", "--tiles", "2", "1"]):
        with pytest.raises(argparse.ArgumentError, match="1 given twice"):
            _parser().parse_args(argv)


def test_the_types_refuse_what_is_out_of_range():
    assert positive("3") == 3 and non_negative("0") == 0 and fraction("0.15") == 0.15
    for kind, bad in ((positive, ("0", "-1", "x", "1.5")), (non_negative, ("-1", "x")), (fraction, ("2", "nan", "x"))):
        for text in bad:
            with pytest.raises(argparse.ArgumentTypeError, match=repr(text)):
                kind(text)


@pytest.mark.parametrize(
    "main,argv,expected",
    [
        (kernels_gpu.main, ["--skip", "quantize", "dense", "--skip", "moe"], "leaves nothing to time"),
        (kernels_gpu.main, ["--out", "."], "a directory"),
        (gpu_main_job.main, ["--config", "nothere.yaml"], "no such file"),
        (gpu_main_job.main, ["--variants", "nvfp4_async", "--variants", "nvfp4_async"], "given twice"),
        (gpu_main_job.main, ["--out", "nowhere/r.json"], "its folder does not exist"),
        (sampler_gpu.main, ["--layers", "0"], "not a positive integer"),
        (sampler_gpu.main, ["--bf16-last-fraction", "nan"], "not a number in [0, 1]"),
        (sampler_gpu.main, ["--modes", "graph", "--modes", "graph"], "given twice"),
        (sampler_gpu.main, ["--out", "."], "a directory"),
        (async_speedup.main, ["--samplers", "1", "4"], "2 must be among them"),
        (async_speedup.main, ["--steps", "0"], "not a positive integer"),
        (async_speedup.main, ["--seeds", "0", "0"], "given twice"),
        (async_speedup.main, ["--out", "."], "a directory"),
    ],
)
def test_bad_values_are_refused_before_a_gpu_or_a_training_run(monkeypatch, capsys, main, argv, expected):
    monkeypatch.setattr(sys, "argv", ["benchmark", *argv])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2 and expected in capsys.readouterr().err
