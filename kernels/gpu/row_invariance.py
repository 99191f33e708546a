"""The launch rules that keep a row's GEMM result independent of the number of rows in the unquantised GEMM
(:mod:`.dense_gemm`); the NVFP4 GEMMs need none (their block-ordered sum fixes every row's bits whatever the
launch, docs/design.md §2.6) and take only :func:`row_tile` from here, for speed.

Row r of a product must not depend on how many rows are computed with it — the sampler decodes a few rows
at a time, the trainer scores thousands, and the bit-exact logprob contract needs the same bits from both.
So what sets a row's summation order — BLOCK_K, the tensor-core operand types, the split of K — is fixed
for every row count (no autotuning, whose pick may differ between processes; no vendor GEMM, which picks
its kernel and split-K by shape), K is split by the column tiles alone, and the split's partial sums are
added in split order.

The row tile (BLOCK_M, num_warps) may follow the rows per weight matrix: it changes which rows a program
holds, not the order in which a row sums over K. That each row then gets the same bits whatever the tile
was measured, not assumed: on the H200 every tile of :data:`ROW_TILES` gave bit-identical rows to (16, 4)
at every row count from 1 to 8192 (packed GEMM, three shapes: benchmarks/gemm_tiles_gpu.py,
benchmarks/results/h200_gemm_tiles.json; dense GEMM, five shapes: benchmarks/dense_gemm_gpu.py,
benchmarks/results/h200_dense_gemm.json), and the table was the packed GEMM's fastest there (measured
while that GEMM still summed in the tensor cores' order).
"""

from __future__ import annotations

import torch

# (rows up to, (BLOCK_M, num_warps))
ROW_TILES = ((16, (16, 4)), (64, (64, 4)), (None, (128, 8)))
REFERENCE_TILE = ROW_TILES[0][1]
ROW_TILES_USED = tuple(tile for _, tile in ROW_TILES)

# Split K until the launch has TARGET_PROGRAMS programs (two per multiprocessor of an H100/H200), keeping at
# least MIN_SPLIT_K elements of K per program (the interpreter, on small test shapes, splits too: the path
# is tested). A constant, not the device's multiprocessor count: a trainer and samplers on different GPUs
# (or MIG slices) must still split, and so sum, alike.
TARGET_PROGRAMS = 2 * 132
MIN_SPLIT_K = {"cuda": 1024, "cpu": 64}


def row_tile(rows_per_matrix: float, device: torch.device) -> tuple[int, int]:
    """``(BLOCK_M, num_warps)`` for ``rows_per_matrix`` rows against one weight matrix (a dense product's M,
    a grouped product's rows per expert), from :data:`ROW_TILES` on CUDA. The Triton interpreter keeps
    :data:`REFERENCE_TILE`: its dot products are NumPy matmuls, whose summation order may depend on the
    tile's rows."""
    if device.type != "cuda":
        return REFERENCE_TILE
    return next(tile for limit, tile in ROW_TILES if limit is None or rows_per_matrix <= limit)


def split_k(column_tiles: int, k: int, device: torch.device) -> int:
    """How many programs share K: a power of two that brings ``column_tiles`` programs towards
    :data:`TARGET_PROGRAMS` (1 when they already reach it), each keeping at least ``MIN_SPLIT_K`` of K. Row
    tiles are not counted, so the split — and each row's summation order — is the same for every number of
    rows."""
    split = 1
    while column_tiles * split < TARGET_PROGRAMS and k // (2 * split) >= MIN_SPLIT_K[device.type]:
        split *= 2
    return split


def sum_in_split_order(parts: torch.Tensor) -> torch.Tensor:
    """``parts[0] + parts[1] + …`` for float32 partial sums ``[SPLIT_K, rows, N]``, element by element in
    split order (a reduction kernel may reorder)."""
    total = parts[0].clone()
    for part in parts[1:]:
        total += part
    return total
