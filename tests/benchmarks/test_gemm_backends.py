"""The gemv sweep's command line (``benchmarks/gemm_backends_gpu.py --sweep``): which tiles it times and how it
reads shapes. Its timings need a GPU; what it is asked to time does not."""

import argparse

import pytest

from benchmarks.gemm_backends_gpu import SWEEP, shape, sweep_tiles


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
