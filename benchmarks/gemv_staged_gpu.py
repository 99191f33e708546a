"""The fragment gemv's staged tiles (operands streamed through a ``cp.async`` ring) beside its direct tiles and
cuBLAS bf16 on dense decode products: the evidence for ``fragment_gemm.STAGED_MAX_ELEMENTS``. For each weight
shape and row count it times the tile the dispatch takes (``gemv_tile``), the direct tile it would take with
staging left out and the staged tile it would take with the size limit lifted, checking each against the gemm
kernel's bits. The shapes straddle the limit, so the record shows where staging stops paying.

Timed as benchmarks/kernels_gpu.py times (CUDA-graph replay, weights rotated through > 256 MB so L2 is cold).
Run on the GPU machine:

    python -m benchmarks.gemv_staged_gpu --out benchmarks/results/h100_gemv_staged.json
"""

from __future__ import annotations

import argparse
from pathlib import Path
from unittest import mock

import torch

from benchmarks.gemm_backends_gpu import packed_activations, packed_weights
from benchmarks.kernels_gpu import copies_for, graph_time
from benchmarks.machine import describe, write_record
from nibble.kernels.gpu import fragment_gemm
from nibble.kernels.gpu import gemm as gpu_gemm

# 8192 x 7168 is the dense shape; the rest are a Qwen3-30B-A3B-shaped sampler's attention projections
# (q: 4096 x 2048, o: 2048 x 4096, k and v: 512 x 2048) and dense weights around the size threshold
SHAPES = ((8192, 7168), (8192, 4096), (6144, 4096), (4096, 4096), (4096, 2048), (2048, 4096), (1536, 2048), (512, 2048))
ROWS = (1, 8, 16, 32)


def bench(n: int, k: int) -> list[dict]:
    qws = packed_weights(n, k)
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies_for(n * k * 2))]
    limit = fragment_gemm.shared_limit(qws[0].codes.device)
    rows = []
    for m in ROWS:
        qx = packed_activations(m, k)
        x = qx.dequantize(torch.bfloat16)
        expected = gpu_gemm.fragment_matmul(qx, qws[0], torch.bfloat16, gemv=False)
        row = {"shape": [n, k], "m": m, "bf16_us": graph_time(lambda i, x=x: x @ ws[i].T, len(ws))["graph_s"] * 1e6}
        tiles = {
            "dispatch": fragment_gemm.gemv_tile(m, -(-n // 16), k, limit),
            "direct": fragment_gemm.gemv_tile(m, -(-n // 16), k, limit, staged=False),
        }
        with mock.patch.object(fragment_gemm, "STAGED_MAX_ELEMENTS", n * k):
            tiles["staged"] = fragment_gemm.gemv_tile(m, -(-n // 16), k, limit)
        for name, tile in tiles.items():

            def run(i, qx=qx, tile=tile):
                return gpu_gemm.fragment_matmul(qx, qws[i], torch.bfloat16, gemv=True, tile=tile)

            row[name] = {
                "tile": list(tile),
                "us": graph_time(run, len(qws))["graph_s"] * 1e6,
                "same_bits": torch.equal(run(0), expected),
            }
        d, b, s = row["dispatch"], row["direct"], row["staged"]
        print(
            f"{n}x{k} M={m:3d}: bf16 {row['bf16_us']:7.2f} us  dispatch {tuple(d['tile'])} {d['us']:7.2f} us "
            f"(x{row['bf16_us'] / d['us']:.2f} bf16)  direct {tuple(b['tile'])} {b['us']:7.2f} us  "
            f"staged {tuple(s['tile'])} {s['us']:7.2f} us  direct/staged {b['us'] / s['us']:.3f}  "
            f"same bits {d['same_bits'] and b['same_bits'] and s['same_bits']}",
            flush=True,
        )
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/h100_gemv_staged.json"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/gemv_staged_gpu.py needs a CUDA GPU")
    torch.manual_seed(0)
    result = {"machine": describe(), "command": "python -m benchmarks.gemv_staged_gpu"}
    result["rows"] = [row for n, k in SHAPES for row in bench(n, k)]
    write_record(args.out, result)


if __name__ == "__main__":
    main()
