"""gemm's tiles (column groups per warp, stages of its cp.async ring, warps per CTA) on the GPU, side by side with
cuBLAS bf16, gemv at the rows where the two kernels cross, and optionally an earlier ``fragment_gemm.cu`` whose gemm is
launched as one group a warp (the grid and block of the gemm before the ring: 64 rows × 8 column groups a CTA,
256 threads). Every output is compared bit for bit with the default tile's, and each tile's CTA count is
recorded, so the dispatch's rule (``fragment_gemm.GEMM_TILES``, ``MIN_GEMM_CTAS``) can be read off the run.

Dense products are timed as benchmarks/kernels_gpu.py times them (CUDA-graph replay, weights rotated through
> 256 MB so L2 is cold); grouped ones on a 128-expert layer's 1536×2048 and 2048×768 stacks. Run on the GPU
machine, e.g.:

    git show 413b04e:kernels/gpu/fragment_gemm.cu > /tmp/before.cu
    python -m benchmarks.gemm_pipeline_gpu --against /tmp/before.cu --out benchmarks/results/h100_gemm_pipeline.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from benchmarks.fragment_kernel_ab_gpu import describe_source, use_source
from benchmarks.gemm_backends_gpu import EXPERTS, packed_activations, packed_stack, packed_weights
from benchmarks.kernels_gpu import copies_for, graph_time
from benchmarks.machine import describe, out_problem, write_record
from benchmarks.options import AddUp
from nibble.kernels.gpu import fragment_gemm
from nibble.kernels.gpu import gemm as gpu_gemm

DENSE = {
    (8192, 7168): (32, 48, 64, 96, 128, 192, 256, 1024, 8192),
    (4096, 4096): (32, 64, 96, 128, 256, 1024, 8192),
    (1536, 2048): (32, 64, 128, 256, 1024),
}
GROUPED = ((1536, 2048), (2048, 768))  # a 128-expert layer's gate/up and down projections
GROUPED_ROWS_PER_EXPERT = (8, 16, 32, 64, 256)
GEMV_ROWS = 256  # gemv is timed beside up to these rows per weight matrix (where it still has a tile)
EARLIER_TILE = (1, 2, 8)  # launches an earlier gemm with its own grid and block; its ring is unused there


def tile(text: str) -> fragment_gemm.GemmTile:
    """``G,S,W`` on the command line: column groups per warp, stages, warps per CTA."""
    try:
        groups, stages, warps = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a gemm tile is GROUPS,STAGES,WARPS, e.g. 2,4,8") from None
    if not fragment_gemm.gemm_tile_builds((groups, stages, warps)):
        raise argparse.ArgumentTypeError(f"{text!r}: a gemm tile is {fragment_gemm.GEMM_TILE_RULE}")
    return groups, stages, warps


def _variants(tiles, also: list[Path], against: Path | None) -> list[tuple[str, Path, fragment_gemm.GemmTile]]:
    """``(label, source, tile)`` of every gemm timed: the working tree's at each tile, then each of ``also``'s
    (variants of it), then the earlier source's."""
    found = [(f"gemm {t}", fragment_gemm.SOURCE, t) for t in tiles]
    found += [(f"{source.name} {t}", source, t) for source in also for t in tiles]
    return found + ([("earlier gemm", against, EARLIER_TILE)] if against else [])


def _time_variants(variants, run, copies: int, expected: torch.Tensor, ctas) -> dict:
    """Seconds per call and same-bits of ``run(i, tile)`` under each variant."""
    row = {}
    for label, source, t in variants:
        use_source(source)
        row[label] = {
            "us": graph_time(lambda i, t=t: run(i, t), copies)["graph_s"] * 1e6,
            "same_bits": torch.equal(run(0, t), expected),
            "ctas": ctas(t),
        }
    return row


def _dense_row(variants, qws, ws, m: int, wgmma: bool) -> dict:
    """One row count of a dense weight (``qws`` packed copies, ``ws`` bf16 copies); ``wgmma``: the warpgroup-MMA
    gemm beside the tiles."""
    n, k = qws[0].shape
    groups = n // 16
    qx = packed_activations(m, k)
    x = qx.dequantize(torch.bfloat16)
    use_source(variants[0][1])
    expected = gpu_gemm.fragment_matmul(qx, qws[0], torch.bfloat16, gemv=False)

    def run(i, t):
        return gpu_gemm.fragment_matmul(qx, qws[i], torch.bfloat16, gemv=False, tile=t)

    row_tiles = -(-m // fragment_gemm.GEMM_ROWS)

    def ctas(t):
        return fragment_gemm.gemm_ctas(row_tiles, groups, t)

    row = {"shape": [n, k], "m": m}
    row["bf16_us"] = graph_time(lambda i: x @ ws[i].T, len(ws))["graph_s"] * 1e6
    if m <= GEMV_ROWS and fragment_gemm.gemv_fits(m, k, qx.device):
        gemv = graph_time(lambda i: gpu_gemm.fragment_matmul(qx, qws[i], torch.bfloat16, gemv=True), len(qws))
        row["gemv_us"] = gemv["graph_s"] * 1e6
    shared = fragment_gemm.shared_limit(qx.device)
    row["default_tile"] = list(fragment_gemm.gemm_tile(row_tiles, groups, shared))
    row["gemm"] = _time_variants(variants, run, len(qws), expected, ctas)
    if wgmma:
        use_source(variants[0][1])
        row["wgmma"] = {}
        for swizzle in fragment_gemm.WGMMA_SWIZZLES:

            def product(i, swizzle=swizzle):
                return gpu_gemm.wgmma_matmul(qx, qws[i], torch.bfloat16, swizzle=swizzle)

            timed = graph_time(product, len(qws))
            same = torch.equal(product(0), expected)
            row["wgmma"][f"swizzle {swizzle}"] = {"us": timed["graph_s"] * 1e6, "same_bits": same}
    print(_line(f"dense {n}x{k} M={m:5d}", row), flush=True)
    return row


def dense(variants, wgmma: bool) -> list[dict]:
    rows = []
    for (n, k), ms in DENSE.items():
        qws = packed_weights(n, k)
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies_for(n * k * 2))]
        rows += [_dense_row(variants, qws, ws, m, wgmma) for m in ms]
        del qws, ws
    return rows


def _grouped_row(variants, qw, wt, r: int) -> dict:
    """``r`` rows on every expert of the stack ``qw`` (packed) / ``wt`` (bf16, ``[E, K, N]``)."""
    n, k = qw.shape[1:]
    experts = torch.arange(EXPERTS, device="cuda").repeat_interleave(r)
    qx = packed_activations(experts.numel(), k)
    x = qx.dequantize(torch.bfloat16)
    offs = torch.arange(1, EXPERTS + 1, device="cuda", dtype=torch.int32) * r
    use_source(variants[0][1])
    expected = gpu_gemm.fragment_grouped_matmul(qx, qw, experts, None, torch.bfloat16, gemv=False)

    def run(_, t):
        return gpu_gemm.fragment_grouped_matmul(qx, qw, experts, None, torch.bfloat16, gemv=False, tile=t)

    row = {"shape": [EXPERTS, n, k], "rows_per_expert": r}
    grid_rows = -(-experts.numel() // fragment_gemm.GEMM_ROWS) + EXPERTS  # the launch's bound (expert_tiles)
    shared = fragment_gemm.shared_limit(qx.device)
    row["default_tile"] = list(fragment_gemm.gemm_tile(grid_rows, n // 16, shared, grouped=True))
    row["bf16_us"] = graph_time(lambda i: torch._grouped_mm(x, wt, offs=offs), 1)["graph_s"] * 1e6
    if r <= GEMV_ROWS and fragment_gemm.gemv_fits(r, k, qx.device):
        gemv = graph_time(
            lambda i: gpu_gemm.fragment_grouped_matmul(qx, qw, experts, None, torch.bfloat16, gemv=True), 1
        )
        row["gemv_us"] = gemv["graph_s"] * 1e6
    row["gemm"] = _time_variants(variants, run, 1, expected, lambda t: None)
    print(_line(f"grouped {EXPERTS}x{n}x{k} rows/expert={r:3d}", row), flush=True)
    return row


def grouped(variants) -> list[dict]:
    rows = []
    for n, k in GROUPED:
        qw = packed_stack(torch.randn(EXPERTS, n, k, device="cuda", dtype=torch.bfloat16) / k**0.5)
        wt = torch.randn(EXPERTS, k, n, device="cuda", dtype=torch.bfloat16)
        rows += [_grouped_row(variants, qw, wt, r) for r in GROUPED_ROWS_PER_EXPERT]
        del qw, wt
    return rows


def _line(label: str, row: dict) -> str:
    parts = [f"bf16 {row['bf16_us']:8.1f}"]
    if "gemv_us" in row:
        parts.append(f"gemv {row['gemv_us']:8.1f}")
    timed = list(row["gemm"].items()) + [(f"wgmma {name}", v) for name, v in row.get("wgmma", {}).items()]
    for name, v in timed:
        differ = "" if v["same_bits"] else " BITS DIFFER"
        parts.append(f"{name} {v['us']:8.1f} (x{row['bf16_us'] / v['us']:.2f}{differ})")
    return f"{label}: " + "  ".join(parts) + " us"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", type=Path, help="an earlier fragment_gemm.cu whose gemm to time beside")
    parser.add_argument(
        "--also", type=Path, action=AddUp, default=[],
        help="variants of the working tree's fragment_gemm.cu (same macros and launch), timed at every tile",
    )  # fmt: skip
    parser.add_argument(
        "--tiles", type=tile, action=AddUp, default=list(fragment_gemm.GEMM_TILES),
        help="gemm tiles GROUPS,STAGES,WARPS to time (default: fragment_gemm.GEMM_TILES)",
    )  # fmt: skip
    parser.add_argument("--skip", action=AddUp, default=[], choices=["dense", "grouped"])
    parser.add_argument(
        "--wgmma", action="store_true", help="also time the warpgroup-MMA gemm, in each layout, on dense products"
    )
    parser.add_argument("--out", type=Path, default=None, help="results JSON")
    args = parser.parse_args()
    for option, path in [("--against", args.against)] + [("--also", p) for p in args.also]:
        try:
            if path is not None and not path.is_file():
                parser.error(f"{option} {path}: {'not a file' if path.exists() else 'no such file'}")
        except OSError as exc:
            parser.error(f"{option} {path}: not a usable path ({exc.strerror or exc})")
        if path is not None and path.suffix != ".cu":
            parser.error(f"{option} {path}: not a CUDA source (.cu)")
    if len({p.name for p in args.also}) < len(args.also):
        parser.error("--also: two sources of the same file name (their results are keyed by it)")
    if {"dense", "grouped"} <= set(args.skip):
        parser.error("--skip: skipping both dense and grouped leaves nothing to time")
    if args.wgmma and "dense" in args.skip:
        parser.error("--wgmma: the warpgroup-MMA gemm is timed on dense products, which --skip dense leaves out")
    if args.out is not None and (problem := out_problem(args.out)):
        parser.error(f"--out {args.out}: {problem}")
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/gemm_pipeline_gpu.py needs a CUDA GPU")
    if args.wgmma and torch.cuda.get_device_capability() != (9, 0):
        raise SystemExit("benchmarks/gemm_pipeline_gpu.py --wgmma needs a Hopper GPU (compute capability 9.0)")
    torch.manual_seed(0)
    ours = fragment_gemm.SOURCE
    variants = _variants(args.tiles, args.also, args.against)
    command = "python -m benchmarks.gemm_pipeline_gpu --tiles " + " ".join(",".join(map(str, t)) for t in args.tiles)
    command += "".join(f" --also {p}" for p in args.also) + (f" --against {args.against}" if args.against else "")
    command += (" --skip " + " ".join(args.skip) if args.skip else "") + (" --wgmma" if args.wgmma else "")
    result = {"machine": describe(), "command": command, "default_tiles": fragment_gemm.GEMM_TILES}
    result["grouped_default_tiles"] = fragment_gemm.GROUPED_GEMM_TILES
    result["sources"] = [describe_source(path) for path in dict.fromkeys(path for _, path, _ in variants)]
    result["min_gemm_ctas"] = fragment_gemm.MIN_GEMM_CTAS
    try:
        if "dense" not in args.skip:
            result["dense"] = dense(variants, args.wgmma)
        if "grouped" not in args.skip:
            result["grouped"] = grouped(variants)
    finally:
        use_source(ours)
    if args.out:
        write_record(args.out, result)


if __name__ == "__main__":
    main()
