"""Row tiles of the packed NVFP4 GEMM on the GPU: which ``(BLOCK_M, num_warps)`` keep every row's bits, and
which is fastest at each row count.

Row invariance (README "Policy model and precision plan") needs each output row to be the same bits
whatever else is computed with it. The tile in M does not change the order in which a row sums over K, but
the tensor-core instruction Triton emits may change with it, so each tile's outputs are compared bit for
bit with those of the reference tile ``(16, 4)``, on every row count. Times are CUDA-graph replays with a
cold L2, beside cuBLAS bf16 (``benchmarks.kernels_gpu``'s method). Run on the GPU machine:

    python -m benchmarks.gemm_tiles_gpu --out benchmarks/results/h200_gemm_tiles.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from benchmarks.kernels_gpu import copies_for, graph_time
from benchmarks.machine import describe, write_record
from nibble.kernels import nvfp4
from nibble.kernels.gpu import gemm as gpu_gemm
from nibble.kernels.gpu import row_invariance
from nibble.kernels.tensors import NVFP4Tensor

REFERENCE = row_invariance.REFERENCE_TILE
TILES = (REFERENCE, (32, 4), (64, 4), (64, 8), (128, 4), (128, 8))
M_VALUES = (1, 16, 32, 64, 128, 512, 1024, 4096, 8192)
SHAPES = ((8192, 7168), (2048, 7168), (7168, 2048))  # dense decode, an expert's gate_up and down


def bench_shape(n: int, k: int) -> list[dict]:
    torch.manual_seed(0)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    qw = nvfp4.quantize(w, scale="per_tensor", four_over_six="mse", validate=False)
    ws = [w.clone() for _ in range(copies_for(n * k * 2))]
    qws = [
        NVFP4Tensor(qw.codes.clone(), qw.block_scales.clone(), qw.global_scale.clone(), True, qw.shape)
        for _ in range(copies_for(qw.nbytes))
    ]
    x_all = torch.randn(max(M_VALUES), k, device="cuda", dtype=torch.bfloat16) * 3
    x_all[7] = 0  # an all-zero row
    qx_all = nvfp4.quantize(x_all, scale="per_token", four_over_six="mse", validate=False)
    reference_all = gpu_gemm.packed_matmul(qx_all, qw, torch.float32, REFERENCE)
    rows = []
    for m in M_VALUES:
        x = x_all[:m]
        qx = NVFP4Tensor(qx_all.codes[:m], qx_all.block_scales[:m], qx_all.global_scale[:m], True, (m, k))
        bf16 = graph_time(lambda i, x=x: x @ ws[i].T, len(ws))
        row = {"shape": [n, k], "m": m, "bf16_cublas": bf16, "tiles": {}}
        for tile in TILES:
            y = gpu_gemm.packed_matmul(qx, qw, torch.float32, tile)
            t = graph_time(
                lambda i, qx=qx, tile=tile: gpu_gemm.packed_matmul(qx, qws[i], torch.bfloat16, tile), len(qws)
            )
            row["tiles"][f"{tile[0]}x{tile[1]}"] = {
                **t,
                "rows_equal_to_reference_tile": bool(torch.equal(y, reference_all[:m])),
                "speedup_vs_bf16": bf16["graph_s"] / t["graph_s"],
            }
        invariant = {name: r for name, r in row["tiles"].items() if r["rows_equal_to_reference_tile"]}
        row["fastest_invariant_tile"] = min(invariant, key=lambda name: invariant[name]["graph_s"])
        print(
            f"{n}x{k} M={m:5d} bf16 {bf16['graph_s'] * 1e6:8.1f} us | "
            + " | ".join(
                f"{name} {r['graph_s'] * 1e6:8.1f} us x{r['speedup_vs_bf16']:.2f}"
                + ("" if r["rows_equal_to_reference_tile"] else " DIFFERS")
                for name, r in row["tiles"].items()
            ),
            flush=True,
        )
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    result = {"machine": describe(), "command": "python -m benchmarks.gemm_tiles_gpu", "rows": []}
    for n, k in SHAPES:
        result["rows"] += bench_shape(n, k)
    if args.out:
        write_record(args.out, result)


if __name__ == "__main__":
    main()
