"""The gemv sweep's command line (``benchmarks/gemm_backends_gpu.py --sweep``): which tiles it times and how it
reads shapes; and the dense dispatch against the crossovers the benchmark recorded on the H100. Its timings need a
GPU; what it is asked to time, and what a record says, do not."""

import argparse
import json
import sys
from pathlib import Path

import pytest

from benchmarks import gemm_backends_gpu, gemm_sass, gemv_profile_gpu
from benchmarks.gemm_backends_gpu import DENSE_SHAPES, SWEEP, dense_crossovers, dispatch_crossover, shape, sweep_tiles
from nibble.kernels.gpu import gemm as gpu_gemm

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def test_the_sweep_times_every_combination_that_builds_and_no_other():
    values = {**SWEEP, "warps": (8, 16), "column_warps": (1, 2, 4), "staged": (0, 1), "prefetch": (1, 2)}
    tiles = sweep_tiles(values)
    assert len(set(tiles)) == len(tiles)
    assert (32, 2, 8, 2, 0, 2) in tiles and (8, 2, 16, 2, 0, 2) in tiles
    assert (8, 2, 16, 1, 0, 4) not in tiles  # 64 warps
    assert (8, 1, 8, 1, 1, 1) not in tiles  # a staged ring of one slot
    # rows per CTA (3) x prefetch (2) x warps (2) x groups (3) x staged (2) x column warps (3), less what cannot build
    refused = sum(1 for w in (8, 16) for c in (1, 2, 4) if w * c > 32) * 3 * 2 * 3 * 2 + 3 * 1 * 3 * (2 * 3 - 1)
    assert len(tiles) == 3 * 2 * 2 * 3 * 2 * 3 - refused


def test_shapes_read_as_n_by_k_and_a_bad_one_names_itself():
    assert shape("8192x7168") == (8192, 7168) and shape("4096X4096") == (4096, 4096)
    for text in ("8192", "8192x", "axb", "1x2x3"):
        with pytest.raises(argparse.ArgumentTypeError, match=repr(text)):
            shape(text)


def test_the_dense_dispatch_takes_gemv_exactly_where_the_h100_measured_it_faster():
    """``gpu_gemm.dense_gemv`` read at the record's row counts gives each shape's measured crossover (gemv up to it,
    gemm from the next measured row count), on the H100's 227 KB a CTA."""
    record = json.loads((RESULTS / "h100_gemm_backends.json").read_text())
    assert "H100" in record["machine"]["gpu"]
    measured = dense_crossovers(record)
    assert len(measured) == len(DENSE_SHAPES) and min(measured) >= 32
    hopper_shared = 232448
    for (n, _), rows in zip(DENSE_SHAPES, measured, strict=True):
        assert dispatch_crossover(n, hopper_shared) == rows, (n, rows)


def test_the_dense_dispatch_keeps_gemv_for_narrow_weights_whatever_k():
    # a 4096 x 14336 down projection has 8192 x 7168's elements but 4096 x 4096's columns: gemm would launch 64 CTAs
    hopper_shared = 232448
    assert gpu_gemm.dense_gemv(64, 4096, hopper_shared) and not gpu_gemm.dense_gemv(64, 8192, hopper_shared)
    assert gpu_gemm.dense_gemv(32, 1 << 20, hopper_shared)  # at most DENSE_GEMV_ROWS[0] rows: gemv
    assert not gpu_gemm.dense_gemv(257, 16, hopper_shared)  # beyond DENSE_GEMV_ROWS[1]: gemm


def _refused(monkeypatch, capsys, main, *argv: str) -> str:
    monkeypatch.setattr(sys, "argv", ["benchmark", *argv])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_bad_input_is_refused_before_the_gpu_is_looked_for(monkeypatch, capsys, tmp_path):
    cases = {
        ("--skip", "dense", "grouped"): "nothing to time",
        ("--skip",): "expected at least one argument",
        ("--out", str(tmp_path)): "a directory",
        ("--out", str(tmp_path / "nowhere" / "r.json")): "its folder does not exist",
        ("--sweep", "--m", "0"): "not a positive integer",
        ("--sweep", "--shapes", "8192x100"): "a positive multiple of 16",
        ("--sweep", "--staged", "5"): "invalid choice",
        ("--sweep", "--warps", "64"): "--warps 64: no combination of these launch parameters",
        ("--sweep", "--groups", "1000"): "--groups 1000: no combination",
        ("--sweep", "--groups", "1", "1000"): "--groups 1000: no gemv tile takes these values",
        ("--sweep", "--shapes", "16x1048576", "4096x4096"): "--shapes 16x1048576: no gemv tile's shared memory fits",
        ("--sweep", "--warps", "4", "64"): "--warps 64: no gemv tile takes these values",
        ("--m", "8"): "--m: only --sweep times launch parameters",
        ("--warps", "4", "--shapes", "4096x4096"): "--warps, --shapes: only --sweep",
        ("--sweep", "--skip", "dense"): "--sweep times gemv's launch parameters only",
        ("--sweep", "--groups", "-2"): "not a positive integer",
    }
    for argv, expected in cases.items():
        assert expected in _refused(monkeypatch, capsys, gemm_backends_gpu.main, *argv), argv


def test_the_profile_driver_refuses_bad_shapes_rows_and_tiles(monkeypatch, capsys):
    cases = {
        ("--shape", "8192", "100"): "a multiple of 16",
        ("--shape", "0", "7168"): "not a positive integer",
        ("--rows", "0"): "not a positive integer",
        ("--kernel", "gemm", "--tile", "2", "9", "4"): "at least two stages whose ring fits",
        ("--kernel", "gemm", "--tile", "2", "4"): "takes 3 values",
        ("--tile", "8", "2", "16", "2", "5", "1"): "staged 0 or 1",
        ("--kernel", "wgmma", "--tile", "2", "4", "8"): "the wgmma gemm has one tile",
        ("--kernel", "wgmma", "--swizzle", "64"): "invalid choice: 64",
        ("--kernel", "gemm", "--swizzle", "32"): "only the wgmma gemm has shared-memory layouts, not gemm",
    }
    for argv, expected in cases.items():
        assert expected in _refused(monkeypatch, capsys, gemv_profile_gpu.main, *argv), argv


def test_the_sass_counter_refuses_a_tile_given_twice(monkeypatch, capsys):
    assert "given twice" in _refused(monkeypatch, capsys, gemm_sass.main, "--tiles", "1,2,4", "1,2,4")
