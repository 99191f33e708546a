"""benchmarks/options.py: a list option given twice adds up; its default stands only when it is never given."""

import argparse

import pytest

from benchmarks.options import AddUp


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
