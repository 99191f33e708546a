"""Launch parameters of the NVFP4 quantise kernel on the GPU: elements per chunk × warps per program, for
the standard and the four-over-six kernel, on the 8192×7168 bf16 per-token activation of
``benchmarks.kernels_gpu`` (its method: CUDA-graph replay, cold L2, copy bandwidth measured in the same run).
Every launch's codes, block scales and global scales are compared with the default launch's, bit for bit.

    python -m benchmarks.quantize_launch_gpu --out benchmarks/results/h200_quantize_launch.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from benchmarks.kernels_gpu import copies_for, copy_bandwidth, graph_time
from benchmarks.machine import describe
from nibble.kernels.gpu import nvfp4 as gpu_nvfp4

CHUNK_ELEMENTS = (512, 1024, 2048, 4096, 8192)
WARPS = (1, 2, 4, 8, 16)


def same_bits(a, b) -> bool:
    return all(
        torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8))
        for x, y in ((a.codes, b.codes), (a.block_scales, b.block_scales), (a.global_scale, b.global_scale))
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    m, k = 8192, 7168
    xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies_for(m * k * 2))]
    moved = m * k * 2 + m * k // 2 + m * k // 16 + m * 4
    copy_bw = copy_bandwidth()
    result = {"machine": describe(), "command": "python -m benchmarks.quantize_launch_gpu", "shape": [m, k]}
    result["copy_bandwidth_Bps"] = copy_bw
    for mode, fos in (("standard", None), ("four_over_six_mse", "mse")):
        reference, _ = gpu_nvfp4.quantize(xs[0], per_token=True, four_over_six=fos)
        rows = []
        for chunk in CHUNK_ELEMENTS:
            for warps in WARPS:
                launch = (chunk, warps)
                try:
                    q, _ = gpu_nvfp4.quantize(xs[0], per_token=True, four_over_six=fos, launch=launch)
                    t = graph_time(
                        lambda i, launch=launch, fos=fos: gpu_nvfp4.quantize(
                            xs[i], per_token=True, four_over_six=fos, launch=launch
                        ),
                        len(xs),
                    )
                except Exception as error:  # a launch the compiler refuses (registers, shared memory)
                    rows.append({"chunk_elements": chunk, "num_warps": warps, "error": str(error)[:200]})
                    continue
                row = {
                    "chunk_elements": chunk,
                    "num_warps": warps,
                    **t,
                    "fraction_of_copy": moved / t["graph_s"] / copy_bw,
                    "same_bits_as_default": same_bits(q, reference),
                }
                rows.append(row)
                print(
                    f"{mode:18s} chunk {chunk:5d} warps {warps:2d}: {t['graph_s'] * 1e6:7.1f} us "
                    f"{row['fraction_of_copy']:.2f} of copy  same bits {row['same_bits_as_default']}",
                    flush=True,
                )
        result[mode] = rows
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
