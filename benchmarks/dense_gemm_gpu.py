"""The row-invariant dense Triton GEMM (``compute.linear`` on CUDA in bf16) against what it replaced and
against cuBLAS, on the Qwen3-30B-A3B-shaped model's unquantised products, at decode and scoring row counts.

For each ``[N, K]`` weight and row count M: the kernel through the row-tile table, the float64 path it
replaced (``F.linear`` of float64 copies, weight conversion included, as ``compute.linear`` did on every
call), and cuBLAS bf16 (not row-invariant: the speed of light). With ``--tiles`` every candidate
``(BLOCK_M, num_warps)`` is timed too and its rows compared bit for bit with the reference tile's (the
evidence for ``row_invariance.ROW_TILES``). Every row of every product is also compared with the same row of
the largest product (row invariance). Times are CUDA-graph replays with a cold L2
(``benchmarks.kernels_gpu``'s method). Run on the GPU machine:

    python -m benchmarks.dense_gemm_gpu --out benchmarks/results/h200_dense_gemm.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.kernels_gpu import copies_for, graph_time
from benchmarks.machine import describe, write_record
from nibble.kernels.gpu import dense_gemm, row_invariance

# (N, K): LM head, q_proj, k/v_proj, o_proj, router of Qwen3-30B-A3B (hidden 2048)
SHAPES = ((151936, 2048), (4096, 2048), (512, 2048), (2048, 4096), (128, 2048))
M_VALUES = (1, 16, 64, 256, 1024, 4096)
FLOAT64_UP_TO = 256  # the float64 path is timed at decode sizes only (it is slow)
TILES = (row_invariance.REFERENCE_TILE, (32, 4), (64, 4), (64, 8), (128, 4), (128, 8))


def _float64_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.linear(x.to(torch.float64), w.to(torch.float64)).to(x.dtype)


def bench_shape(n: int, k: int, sweep_tiles: bool) -> list[dict]:
    torch.manual_seed(0)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    ws = [w.clone() for _ in range(copies_for(n * k * 2))]
    x_all = torch.randn(max(M_VALUES), k, device="cuda", dtype=torch.bfloat16)
    full = dense_gemm.matmul(x_all, w)
    reference_all = dense_gemm.matmul(x_all, w, tile=row_invariance.REFERENCE_TILE)
    rows = []
    for m in M_VALUES:
        x = x_all[:m]
        y = dense_gemm.matmul(x, w)
        ref = x.double() @ w.double().T
        exact = float((y.double() - ref).norm() / ref.norm())
        del ref
        row = {
            "shape": [n, k],
            "m": m,
            "tile": list(row_invariance.row_tile(m, x.device)),
            "split_k": dense_gemm.split_k(n, k, x.device),
            "rows_equal_to_largest_product": bool(torch.equal(y, full[:m])),
            "rel_frobenius_vs_float64": exact,
            "triton": graph_time(lambda i, x=x: dense_gemm.matmul(x, ws[i]), len(ws)),
            "bf16_cublas": graph_time(lambda i, x=x: x @ ws[i].T, len(ws)),
        }
        if m <= FLOAT64_UP_TO:
            row["float64_path"] = graph_time(lambda i, x=x: _float64_linear(x, ws[i]), len(ws))
        if sweep_tiles:
            row["tiles"] = {}
            for tile in TILES:
                t = graph_time(lambda i, x=x, tile=tile: dense_gemm.matmul(x, ws[i], tile=tile), len(ws))
                same = bool(torch.equal(dense_gemm.matmul(x, w, tile=tile), reference_all[:m]))
                row["tiles"][f"{tile[0]}x{tile[1]}"] = {**t, "rows_equal_to_reference_tile": same}
        us = {key: row[key]["graph_s"] * 1e6 for key in ("triton", "bf16_cublas", "float64_path") if key in row}
        print(
            f"{n}x{k} M={m:5d} tile {row['tile']} split {row['split_k']} "
            + " | ".join(f"{key} {t:9.1f} us" for key, t in us.items())
            + f" | rows equal {row['rows_equal_to_largest_product']} | rel {exact:.1e}"
            + (
                ""
                if not sweep_tiles
                else " | "
                + " ".join(
                    f"{name} {r['graph_s'] * 1e6:.1f}" + ("" if r["rows_equal_to_reference_tile"] else " DIFFERS")
                    for name, r in row["tiles"].items()
                )
            ),
            flush=True,
        )
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--tiles", action="store_true", help="also time and compare every candidate row tile")
    args = parser.parse_args()
    command = "python -m benchmarks.dense_gemm_gpu" + (" --tiles" if args.tiles else "")
    result = {"machine": describe(), "command": command, "rows": []}
    for n, k in SHAPES:
        result["rows"] += bench_shape(n, k, args.tiles)
    if args.out:
        write_record(args.out, result)


if __name__ == "__main__":
    main()
