"""The NVFP4 GEMM kernels side by side on the GPU, to set where each runs (``DENSE_GEMV_ROWS`` and
``GROUPED_CROSSOVER_ROWS`` in ``kernels/gpu/gemm.py``): the CUDA fragment kernels ``gemv`` and ``gemm``, with cuBLAS
bf16 beside them (and the portable Triton kernel at small row counts), over the row counts a sampler and a trainer
use, dense and grouped. All give the same bits (checked here on every measured shape), so the choice is speed only.
``--sweep`` times gemv's launch parameters instead.

Timed as benchmarks/kernels_gpu.py times (CUDA-graph replay, weights rotated through > 256 MB so L2 is
cold). Run on the GPU machine:

    python -m benchmarks.gemm_backends_gpu --out benchmarks/results/h200_gemm_backends.json
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import torch

from benchmarks.kernels_gpu import copies_for, graph_time
from benchmarks.machine import describe, out_problem, write_record
from benchmarks.options import AddUp, positive
from nibble.kernels import gemm, nvfp4
from nibble.kernels.gpu import fragment_gemm, grouped
from nibble.kernels.gpu import gemm as gpu_gemm
from nibble.kernels.tensors import NVFP4Tensor

DENSE_SHAPES = ((8192, 7168), (4096, 4096), (1536, 2048))
DENSE_ROWS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 256, 1024, 4096)
TRITON_ROWS = 8  # the portable Triton kernel is timed up to here (one dot per block: far slower beyond)
EXPERTS, HIDDEN, INTER = 128, 2048, 768
GROUPED_ROWS_PER_EXPERT = (1, 2, 4, 8, 16, 32, 64)
SWEEP = {  # each launch parameter's values the sweep tries unless its option names others; in the tile's order
    "prefetch": (1, 2, 4),
    "warps": (4, 8),
    "groups": (1, 2, 4),
    "staged": (0, 1),
    "column_warps": (1,),
}
SWEEP_SHAPES = ((8192, 7168), (4096, 4096), (1536, 2048))
SWEEP_ROWS = (1, 8, 16, 32, 64)


def sweep_tiles(values: dict[str, tuple[int, ...]], k: int | None = None) -> tuple[fragment_gemm.GemvTile, ...]:
    """The gemv tiles ``--sweep`` times: rows per CTA × the product of ``values``' prefetch quads, warps splitting
    K, column groups per warp, staged or not and column warps (tiles that build: ``fragment_gemm.tile_builds``),
    and with ``k`` those whose shared memory at that K fits the most any GPU gives a CTA."""
    tiles = itertools.product((8, 16, 32), *(values[name] for name in SWEEP))
    return tuple(tile for tile in tiles if fragment_gemm.tile_builds(tile) and (k is None or _fits(tile, k)))


def _fits(tile: fragment_gemm.GemvTile, k: int) -> bool:
    """Whether ``tile``'s shared memory at ``k`` fits the most any GPU gives a CTA."""
    return fragment_gemm.gemv_shared_bytes(tile, k) <= fragment_gemm.MAX_SHARED_BYTES


def unbuildable(values: dict[str, tuple[int, ...]], k: int | None = None) -> dict[str, tuple[int, ...]]:
    """Per launch parameter of :data:`SWEEP`, the values among ``values`` that no tile of :func:`sweep_tiles`
    (at ``k``) takes (a sweep would leave them out unsaid); empty where every value is timed."""
    tiles = sweep_tiles(values, k)
    taken = {name: {tile[1 + i] for tile in tiles} for i, name in enumerate(SWEEP)}
    unused = {name: tuple(v for v in values[name] if v not in taken[name]) for name in SWEEP}
    return {name: v for name, v in unused.items() if v}


def packed_weights(n: int, k: int, copies: int | None = None) -> list[NVFP4Tensor]:
    """``copies`` copies (by default > 256 MB in all) of one quantised weight in the sampler's form (codes, scales
    and fragments)."""
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    qw = nvfp4.quantize(w, scale="per_tensor", four_over_six="mse", validate=False)
    return [
        gemm.with_fragments(NVFP4Tensor(qw.codes.clone(), qw.block_scales.clone(), qw.global_scale, True, qw.shape))
        for _ in range(copies or copies_for(qw.nbytes))
    ]


def packed_activations(m: int, k: int) -> NVFP4Tensor:
    """``m`` Gaussian activation rows ``[m, k]`` quantised as a sampler's products take them (per token, 4/6)."""
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    return nvfp4.quantize(x, scale="per_token", four_over_six="mse", validate=False)


def _dense(n: int, k: int) -> list[dict]:
    qws = packed_weights(n, k)
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies_for(n * k * 2))]
    rows = []
    for m in DENSE_ROWS:
        qx = packed_activations(m, k)
        x = qx.dequantize(torch.bfloat16)
        gemv = gpu_gemm.fragment_matmul(qx, qws[0], torch.float32, gemv=True)
        same = torch.equal(gemv, gpu_gemm.fragment_matmul(qx, qws[0], torch.float32, gemv=False))
        if m <= TRITON_ROWS:
            same = same and torch.equal(gemv, gpu_gemm.packed_matmul(qx, qws[0], torch.float32))

        def run(i, qx=qx, gemv=True):
            return gpu_gemm.fragment_matmul(qx, qws[i], torch.bfloat16, gemv=gemv)

        row = {
            "shape": [n, k],
            "m": m,
            "bf16": graph_time(lambda i, x=x: x @ ws[i].T, len(ws)),
            "gemv": graph_time(run, len(qws)),
            "gemm": graph_time(lambda i, qx=qx: run(i, qx, False), len(qws)),
            "same_bits": same,
        }
        if m <= TRITON_ROWS:
            row["triton"] = graph_time(lambda i, qx=qx: gpu_gemm.packed_matmul(qx, qws[i], torch.bfloat16), len(qws))
        triton_us = row["triton"]["graph_s"] * 1e6 if "triton" in row else float("nan")
        print(
            f"dense {n}x{k} M={m:4d}: bf16 {row['bf16']['graph_s'] * 1e6:8.1f} us  gemv "
            f"{row['gemv']['graph_s'] * 1e6:8.1f} us  gemm {row['gemm']['graph_s'] * 1e6:8.1f} us  "
            f"triton {triton_us:8.1f} us  same bits {same}",
            flush=True,
        )
        rows.append(row)
    return rows


def packed_stack(w: torch.Tensor) -> NVFP4Tensor:
    """An expert stack ``w [E, N, K]`` quantised with one global scale per expert, with its fragment layout."""
    e = w.shape[0]
    flat = nvfp4.quantize(w.reshape(e, -1), scale="per_token", four_over_six="mse", validate=False)
    q = NVFP4Tensor(
        flat.codes.reshape(*w.shape[:-1], w.shape[-1] // 2),
        flat.block_scales.reshape(*w.shape[:-1], w.shape[-1] // 16),
        flat.global_scale,
        True,
        w.shape,
    )
    return gemm.with_fragments(q)


def _grouped(n: int, k: int) -> list[dict]:
    """One projection of a 128-expert layer with ``r`` rows on every expert."""
    w = torch.randn(EXPERTS, n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    qw, wt = packed_stack(w), w.transpose(1, 2)
    rows = []
    for r in GROUPED_ROWS_PER_EXPERT:
        experts = torch.arange(EXPERTS, device="cuda").repeat_interleave(r)
        qx = packed_activations(experts.numel(), k)
        x = qx.dequantize(torch.bfloat16)
        offs = torch.cumsum(grouped.expert_counts(experts, EXPERTS), 0).to(torch.int32)

        def run(_, qx=qx, e=experts, gemv=True):
            return gpu_gemm.fragment_grouped_matmul(qx, qw, e, None, torch.bfloat16, gemv=gemv)

        same = torch.equal(run(0), run(0, gemv=False))
        row = {
            "shape": [EXPERTS, n, k],
            "rows_per_expert": r,
            "bf16": graph_time(lambda i, x=x, offs=offs: torch._grouped_mm(x, wt, offs=offs), 1),
            "gemv": graph_time(run, 1),
            "gemm": graph_time(lambda i, qx=qx, e=experts: run(i, qx, e, False), 1),
            "same_bits": same,
        }
        print(
            f"grouped {EXPERTS}x{n}x{k} rows/expert={r:3d}: bf16 {row['bf16']['graph_s'] * 1e6:8.1f} us  "
            f"gemv {row['gemv']['graph_s'] * 1e6:8.1f} us  gemm {row['gemm']['graph_s'] * 1e6:8.1f} us"
            f"  same bits {same}",
            flush=True,
        )
        rows.append(row)
    return rows


def sweep(values: dict[str, tuple[int, ...]], shapes: list[tuple[int, int]], ms: list[int]) -> list[dict]:
    """gemv's launch parameters (:func:`sweep_tiles` of ``values``, and the default tiles beside them) on
    ``shapes`` (N, K) at ``ms`` rows; every one gives gemm's bits (checked). Each M tries the tiles of its default
    row count whose chunk sums fit a CTA's shared memory."""
    out = []
    tiles = dict.fromkeys(sweep_tiles(values) + fragment_gemm.STAGED_GEMV_TILES + fragment_gemm.GEMV_TILES)
    for n, k in shapes:
        qws = packed_weights(n, k)
        for m in ms:
            qx = packed_activations(m, k)
            expected = gpu_gemm.fragment_matmul(qx, qws[0], torch.bfloat16, gemv=False)
            rows = fragment_gemm.rows_per_cta(m, gemv=True)
            for tile in tiles:
                if tile[0] != rows or not fragment_gemm.tile_fits(tile, k, qx.device):
                    continue

                def run(i, qx=qx, tile=tile, qws=qws):
                    return gpu_gemm.fragment_matmul(qx, qws[i], torch.bfloat16, gemv=True, tile=tile)

                t = graph_time(run, len(qws))
                same = torch.equal(run(0), expected)
                out.append({"shape": [n, k], "m": m, "tile": list(tile), **t, "same_bits": same})
                print(f"gemv {n}x{k} M={m:3d} tile={tile}: {t['graph_s'] * 1e6:7.1f} us  {same}", flush=True)
    return out


def shape(text: str) -> tuple[int, int]:
    """``NxK`` as ``(N, K)``, for ``--shapes``: both positive, K whole 16-element blocks."""
    try:
        n, k = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a shape is N x K, e.g. 8192x7168, not {text!r}") from None
    if n < 1 or k < 16 or k % 16:
        raise argparse.ArgumentTypeError(f"{text!r}: N must be positive and K a positive multiple of 16")
    return n, k


def dense_crossovers(result: dict) -> list[int]:
    """The measured crossover of each of :data:`DENSE_SHAPES` in a record's ``"dense"`` rows (none without them)."""
    return [crossover([r for r in result.get("dense", []) if r["shape"] == [n, k]], "m") for n, k in DENSE_SHAPES]


def dispatch_crossover(n: int, shared_bytes: int, rows: tuple[int, ...] = DENSE_ROWS) -> int:
    """The largest of ``rows`` up to which ``gpu_gemm.dense_gemv`` takes gemv at every one of them, for a weight of
    ``n`` columns on a GPU of ``shared_bytes`` a CTA: what :func:`crossover` measures, read off the dispatch."""
    best = 0
    for m in sorted(rows):
        if not gpu_gemm.dense_gemv(m, n, shared_bytes):
            break
        best = m
    return best


def crossover(rows: list[dict], key: str) -> int:
    """The largest row count up to which gemv beat gemm at every measured count."""
    best = 0
    for row in sorted(rows, key=lambda r: r[key]):
        if row["gemv"]["graph_s"] >= row["gemm"]["graph_s"]:
            break
        best = row[key]
    return best


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def _check_sweep(parser: argparse.ArgumentParser, args: argparse.Namespace, values: dict) -> None:
    """Refuse launch parameters a sweep would drop unsaid: values no tile takes that builds and fits a CTA at the
    least K given, and shapes at whose K no tile (swept or default) fits."""
    least_k = min(k for _, k in args.shapes)
    if not sweep_tiles(values, least_k):
        given = [name for name in SWEEP if getattr(args, name) is not parser.get_default(name)] or list(SWEEP)
        parser.error(
            "; ".join(f"{_option(name)} {' '.join(map(str, values[name]))}" for name in given)
            + f": no combination of these launch parameters makes a gemv tile that builds and fits a CTA at K = "
            f"{least_k} (fragment_gemm.tile_builds, MAX_SHARED_BYTES)"
        )
    if unused := unbuildable(values, least_k):
        parser.error(
            "; ".join(f"{_option(name)} {' '.join(map(str, v))}" for name, v in unused.items())
            + f": no gemv tile takes these values with the others given, building and fitting a CTA at K = {least_k}"
            " (fragment_gemm.tile_builds, MAX_SHARED_BYTES)"
        )
    defaults = fragment_gemm.STAGED_GEMV_TILES + fragment_gemm.GEMV_TILES
    for n, k in args.shapes:
        if not sweep_tiles(values, k) and not any(_fits(t, k) for t in defaults):
            parser.error(f"--shapes {n}x{k}: no gemv tile's shared memory fits a CTA at K = {k}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/gemm_backends.json"), help="results JSON")
    parser.add_argument("--skip", action=AddUp, default=[], choices=["dense", "grouped"])
    parser.add_argument("--sweep", action="store_true", help="time the fragment kernel's launch parameters instead")
    for name, default in SWEEP.items():
        option = _option(name)
        kind = {"choices": (0, 1), "type": int} if name == "staged" else {"type": positive}
        parser.add_argument(option, action=AddUp, default=default, help=f"{name} values --sweep tries", **kind)
    parser.add_argument("--shapes", action=AddUp, type=shape, default=SWEEP_SHAPES, help="N x K --sweep times")
    parser.add_argument("--m", action=AddUp, type=positive, default=SWEEP_ROWS, help="row counts --sweep times")
    args = parser.parse_args()
    if {"dense", "grouped"} <= set(args.skip):
        parser.error("--skip: skipping both dense and grouped leaves nothing to time")
    if problem := out_problem(args.out):
        parser.error(f"--out {args.out}: {problem}")
    if args.sweep and args.skip:
        parser.error("--skip: --sweep times gemv's launch parameters only, never dense or grouped products")
    values = {name: tuple(getattr(args, name)) for name in SWEEP}
    sweep_options = [*SWEEP, "shapes", "m"]
    if not args.sweep and (
        given := [name for name in sweep_options if getattr(args, name) is not parser.get_default(name)]
    ):
        parser.error(f"{', '.join(_option(name) for name in given)}: only --sweep times launch parameters; add --sweep")
    if args.sweep:
        _check_sweep(parser, args, values)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/gemm_backends_gpu.py needs a CUDA GPU")
    torch.manual_seed(0)
    command = "python -m benchmarks.gemm_backends_gpu" + (" --skip " + " ".join(args.skip) if args.skip else "")
    if args.sweep:
        options = {**values, "shapes": [f"{n}x{k}" for n, k in args.shapes], "m": args.m}
        command += " --sweep " + " ".join(f"{_option(name)} " + " ".join(map(str, v)) for name, v in options.items())
    result = {"machine": describe(), "command": command}
    if args.sweep:
        result["sweep"] = sweep(values, args.shapes, args.m)
    else:
        if "dense" not in args.skip:
            result["dense"] = [row for n, k in DENSE_SHAPES for row in _dense(n, k)]
            result["crossover_rows_dense_per_shape"] = dense_crossovers(result)
        if "grouped" not in args.skip:
            result["grouped"] = _grouped(2 * INTER, HIDDEN) + _grouped(HIDDEN, INTER)
            result["crossover_rows_grouped_per_shape"] = [
                crossover([r for r in result["grouped"] if r["shape"][1:] == [n, k]], "rows_per_expert")
                for n, k in ((2 * INTER, HIDDEN), (HIDDEN, INTER))
            ]
        shared = fragment_gemm.shared_limit(torch.device("cuda"))
        # measured: dense per N x K, grouped the least over both projections; beside it what gpu_gemm's rule takes
        result["crossover_rows"], result["dispatch_crossover_rows"] = {}, {}
        if "dense" in result:
            names = [f"{n}x{k}" for n, k in DENSE_SHAPES]
            measured = result["crossover_rows_dense_per_shape"]
            result["crossover_rows"]["dense"] = dict(zip(names, measured, strict=True))
            dispatch = [dispatch_crossover(n, shared) for n, _ in DENSE_SHAPES]
            result["dispatch_crossover_rows"]["dense"] = dict(zip(names, dispatch, strict=True))
        if "grouped" in result:
            result["crossover_rows"]["grouped"] = min(result["crossover_rows_grouped_per_shape"])
            result["dispatch_crossover_rows"]["grouped"] = gpu_gemm.GROUPED_CROSSOVER_ROWS
        print(f"crossover (gemv up to these rows per weight, gemm beyond): {result['crossover_rows']}")
        print(f"the dispatch's crossover at the same row counts: {result['dispatch_crossover_rows']}")
        if result["crossover_rows"] != result["dispatch_crossover_rows"]:
            print("the dispatch differs from this measurement: see DENSE_GEMV_ROWS, GROUPED_CROSSOVER_ROWS")
    write_record(args.out, result)


if __name__ == "__main__":
    main()
