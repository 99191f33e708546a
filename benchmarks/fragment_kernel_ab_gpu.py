"""Two versions of the CUDA fragment kernels (``kernels/gpu/fragment_gemm.cu``) side by side on the GPU: the
working tree's (a) and another source file (b: an earlier commit's, a variant being tried), through the
working tree's launch code, so b must keep its kernels' names, arguments, macros and launch (a gemm from before
its cp.async ring, 413b04e and earlier, covers one column group a warp where the launcher now plans two, and
one from before its four-warp tiles, 226e4b7 and earlier, fixes its launch bounds for eight warps: time such a gemm
with ``benchmarks.gemm_pipeline_gpu --against``, which launches it as it was). Each shape is timed
for both, twice, interleaved (``a b a b``: the second pass of a run is often slower for both, so compare
within a pass), and both versions' outputs are compared bit for bit: dense products on 8192×7168 beside
cuBLAS bf16 (float32 and bf16 output, gemv and gemm), grouped ones on a 128-expert 1536×2048 stack (float32
output, gemv and gemm). ``--sweep`` adds gemv's launch parameters for a's kernel at decode sizes. The
record names both sources by sha256 and the commit of the working tree.

Timed as benchmarks/kernels_gpu.py times (CUDA-graph replay; dense weights rotated through > 256 MB so L2
is cold; the grouped stack is one 216 MB copy, larger than L2). Run on the GPU machine, e.g. against the
kernels of commit 56a5853:

    git show 56a5853:kernels/gpu/fragment_gemm.cu > /tmp/before.cu
    python -m benchmarks.fragment_kernel_ab_gpu --against /tmp/before.cu --out benchmarks/results/h200_fragment_ab.json
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
from pathlib import Path

import torch

from benchmarks.gemm_backends_gpu import EXPERTS, SWEEP, packed_activations, packed_stack, packed_weights, sweep_tiles
from benchmarks.kernels_gpu import copies_for, graph_time
from benchmarks.machine import describe, write_record
from nibble.kernels.gpu import fragment_gemm
from nibble.kernels.gpu import gemm as gpu_gemm

DENSE = (8192, 7168)
DENSE_ROWS = (1, 8, 16, 32, 64, 256, 1024)
GROUPED = (1536, 2048)  # one gate/up projection of a 128-expert layer
GROUPED_ROWS_PER_EXPERT = (1, 4, 16, 64)
PASSES = ("a", "b", "a", "b")


def use_source(source: Path) -> None:
    """Compile the fragment kernels from ``source`` from now on (the compiled modules are dropped)."""
    fragment_gemm.SOURCE = source
    fragment_gemm._module.cache_clear()


def _compare(sources: dict[str, Path], time_one, outputs) -> dict:
    """``time_one()`` seconds and ``outputs()`` tensors under each source, interleaved by :data:`PASSES`."""
    row: dict = {"a_us": [], "b_us": []}
    got = {}
    for name in PASSES:
        use_source(sources[name])
        row[f"{name}_us"].append(time_one() * 1e6)
        got[name] = outputs()
    row["same_bits"] = all(torch.equal(x, y) for x, y in zip(got["a"], got["b"], strict=True))
    return row


def dense(sources: dict[str, Path]) -> list[dict]:
    n, k = DENSE
    qws = packed_weights(n, k)
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies_for(n * k * 2))]
    rows = []
    for m in DENSE_ROWS:
        qx = packed_activations(m, k)
        x = qx.dequantize(torch.bfloat16)
        row = {"shape": [n, k], "m": m, "bf16_us": graph_time(lambda i, x=x: x @ ws[i].T, len(ws))["graph_s"] * 1e6}
        row |= _compare(
            sources,
            lambda qx=qx: graph_time(lambda i: gpu_gemm.fragment_matmul(qx, qws[i], torch.bfloat16), len(qws))[
                "graph_s"
            ],
            lambda qx=qx: [
                gpu_gemm.fragment_matmul(qx, qws[0], dtype, gemv=gemv)
                for dtype in (torch.float32, torch.bfloat16)
                for gemv in (True, False)
            ],
        )
        print(_line(f"dense {n}x{k} M={m:5d}", row), flush=True)
        rows.append(row)
    return rows


def grouped(sources: dict[str, Path]) -> list[dict]:
    n, k = GROUPED
    qw = packed_stack(torch.randn(EXPERTS, n, k, device="cuda", dtype=torch.bfloat16) / k**0.5)
    rows = []
    for r in GROUPED_ROWS_PER_EXPERT:
        experts = torch.arange(EXPERTS, device="cuda").repeat_interleave(r)
        qx = packed_activations(experts.numel(), k)

        def run(gemv=None, dtype=torch.bfloat16, qx=qx, experts=experts):
            return gpu_gemm.fragment_grouped_matmul(qx, qw, experts, None, dtype, gemv=gemv)

        row = {"shape": [EXPERTS, n, k], "rows_per_expert": r}
        row |= _compare(
            sources,
            lambda run=run: graph_time(lambda i: run(), 1)["graph_s"],
            lambda run=run: [run(gemv, torch.float32) for gemv in (True, False)],
        )
        print(_line(f"grouped {EXPERTS}x{n}x{k} rows/expert={r:3d}", row), flush=True)
        rows.append(row)
    return rows


def sweep() -> list[dict]:
    """The working tree's gemv at every tile of ``gemm_backends_gpu.sweep_tiles`` (its default values) whose rows
    per CTA are at most M's default, 8192×7168."""
    n, k = DENSE
    qws = packed_weights(n, k)
    out = []
    for m in (1, 8, 16, 32):
        qx = packed_activations(m, k)
        expected = gpu_gemm.fragment_matmul(qx, qws[0], torch.bfloat16, gemv=False)
        most = fragment_gemm.rows_per_cta(m, gemv=True)
        rows = sorted({tile[0] for tile in fragment_gemm.GEMV_TILES if tile[0] <= most})
        for tile in sweep_tiles(SWEEP):
            if tile[0] not in rows or not fragment_gemm.tile_fits(tile, k, qx.device):
                continue

            def run(i, qx=qx, tile=tile):
                return gpu_gemm.fragment_matmul(qx, qws[i], torch.bfloat16, gemv=True, tile=tile)

            t = graph_time(run, len(qws))["graph_s"] * 1e6
            same = torch.equal(run(0), expected)
            out.append({"shape": [n, k], "m": m, "tile": list(tile), "us": t, "same_bits": same})
            print(f"sweep M={m:3d} tile={tile}: {t:7.2f} us  same bits {same}", flush=True)
    return out


def _line(label: str, row: dict) -> str:
    a, b = row["a_us"], row["b_us"]
    bf16 = f"bf16 {row['bf16_us']:7.2f}  " if "bf16_us" in row else ""
    pairs = enumerate(zip(a, b, strict=True))
    passes = "  ".join(f"pass {p}: a {x:7.2f} b {y:7.2f} ({x / y:.3f}x)" for p, (x, y) in pairs)
    return f"{label}: {bf16}{passes}  same bits {row['same_bits']}"


def describe_source(path: Path) -> dict:
    """The source's path and sha256, so that a record says which kernels it compared."""
    return {"path": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def _working_tree() -> dict:
    """The commit of the working tree and whether it differed from it (None where git is not there)."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout
        dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "uncommitted_changes": None}
    return {"commit": commit.strip(), "uncommitted_changes": bool(dirty.strip())}


def _check_compiles(source: Path) -> str | None:
    """Why ``source`` cannot serve as the kernels (it does not compile, or lacks a kernel), or None."""
    use_source(source)
    try:
        tiles = fragment_gemm.GEMV_TILES[0], fragment_gemm.GEMM_TILES[-1]
        fragment_gemm._module(*tiles, False, False, True, torch.cuda.current_device())
    except Exception as error:  # NVRTC's compile log or a missing kernel name, whatever the cause
        return f"{type(error).__name__}: {str(error).strip()[:2000]}"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--against", type=Path, required=True,
        help="the other fragment_gemm.cu (b): same kernel names, arguments and macros as the working tree's",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=None, help="results JSON")
    parser.add_argument("--sweep", action="store_true", help="also time gemv's launch parameters (a)")
    args = parser.parse_args()
    if not args.against.is_file():
        parser.error(f"--against {args.against}: {'not a file' if args.against.exists() else 'no such file'}")
    if args.against.suffix != ".cu":
        parser.error(f"--against {args.against}: not a CUDA source (.cu)")
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/fragment_kernel_ab_gpu.py needs a CUDA GPU")
    sources = {"a": fragment_gemm.SOURCE, "b": args.against}
    try:
        for name, source in sources.items():
            if (why := _check_compiles(source)) is not None:
                parser.error(f"{'--against ' if name == 'b' else ''}{source}: does not compile as the kernels ({why})")
        torch.manual_seed(0)
        result = {
            "machine": describe(),
            "command": "python -m benchmarks.fragment_kernel_ab_gpu --against " + str(args.against)
            + " --sweep" * args.sweep,
            "a": {**describe_source(sources["a"]), **_working_tree()},
            "b": describe_source(sources["b"]),
            "dense": dense(sources),
            "grouped": grouped(sources),
        }  # fmt: skip
        use_source(sources["a"])
        if args.sweep:
            result["sweep"] = sweep()
    finally:
        use_source(sources["a"])
    if args.out:
        write_record(args.out, result)


if __name__ == "__main__":
    main()
