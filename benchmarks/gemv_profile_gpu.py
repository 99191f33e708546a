"""A driver for Nsight Compute: the fragment gemv (or, with ``--kernel gemm``, gemm; with ``--kernel wgmma``,
the warpgroup-MMA gemm, whose activation decode and K permutation run inside the range too: name its kernel to
ncu) once per row count inside an NVTX range ``prof`` (after a warm-up outside it), so ``ncu --nvtx --nvtx-include
prof/`` profiles exactly those launches. Times nothing itself; the counters are ncu's. Run on the GPU machine, e.g.:

    ncu --clock-control none --nvtx --nvtx-include prof/ --section SpeedOfLight --section WarpStateStats \
        python -m benchmarks.gemv_profile_gpu --shape 8192 7168 --rows 1 8 32
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.gemm_backends_gpu import packed_activations, packed_weights
from benchmarks.options import AddUp, positive
from nibble.kernels.gpu import fragment_gemm
from nibble.kernels.gpu import gemm as gpu_gemm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", nargs=2, type=positive, default=[8192, 7168], metavar=("N", "K"))
    parser.add_argument(
        "--rows", action=AddUp, type=positive, default=[1, 8, 32], help="activation rows M, one launch each"
    )
    parser.add_argument("--kernel", choices=["gemv", "gemm", "wgmma"], default="gemv")
    parser.add_argument(
        "--tile",
        nargs="+",
        type=int,
        default=None,
        help="a tile instead of the default: gemv's (rows, prefetch, warps, groups, staged, column warps) or "
        "gemm's (groups per warp, stages, warps)",
    )
    parser.add_argument(
        "--swizzle",
        type=int,
        choices=fragment_gemm.WGMMA_SWIZZLES,
        default=None,
        help="the wgmma gemm's shared-memory layout (default 0)",
    )
    args = parser.parse_args()
    if args.swizzle is not None and args.kernel != "wgmma":
        parser.error(f"--swizzle: only the wgmma gemm has shared-memory layouts, not {args.kernel}")
    if args.shape[1] % 16:
        parser.error(f"--shape {args.shape[0]} {args.shape[1]}: K must be a multiple of 16 (NVFP4 blocks)")
    gemv = args.kernel == "gemv"
    if args.tile and args.kernel == "wgmma":
        parser.error("--tile: the wgmma gemm has one tile (128 rows by 128 columns a CTA)")
    if args.tile and len(args.tile) != (6 if gemv else 3):
        parser.error(f"--tile: {args.kernel} takes {6 if gemv else 3} values, got {len(args.tile)}")
    builds = fragment_gemm.tile_builds if gemv else fragment_gemm.gemm_tile_builds
    if args.tile and not builds(tuple(args.tile)):
        values = " ".join(map(str, args.tile))
        rule = fragment_gemm.GEMV_TILE_RULE if gemv else fragment_gemm.GEMM_TILE_RULE
        parser.error(f"--tile {values}: makes no {args.kernel} kernel; a tile is {rule}")
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/gemv_profile_gpu.py needs a CUDA GPU")
    if args.kernel == "wgmma" and torch.cuda.get_device_capability() != (9, 0):
        raise SystemExit("benchmarks/gemv_profile_gpu.py --kernel wgmma needs a Hopper GPU (compute capability 9.0)")
    torch.manual_seed(0)
    n, k = args.shape
    (qw,) = packed_weights(n, k, copies=1)
    tile = tuple(args.tile) if args.tile else None
    inputs = [packed_activations(m, k) for m in args.rows]

    def product(qx):
        if args.kernel == "wgmma":
            return gpu_gemm.wgmma_matmul(qx, qw, torch.bfloat16, swizzle=args.swizzle or 0)
        return gpu_gemm.fragment_matmul(qx, qw, torch.bfloat16, gemv=gemv, tile=tile)

    for qx in inputs:  # compile and warm up outside the profiled range
        product(qx)
    torch.cuda.synchronize()
    for m, qx in zip(args.rows, inputs, strict=True):
        with torch.cuda.nvtx.range("prof"):
            product(qx)
        torch.cuda.synchronize()
        layout = f" swizzle={args.swizzle or 0}" if args.kernel == "wgmma" else ""
        print(f"profiled {args.kernel} {n}x{k} M={m} tile={tile or 'default'}{layout}", flush=True)


if __name__ == "__main__":
    main()
