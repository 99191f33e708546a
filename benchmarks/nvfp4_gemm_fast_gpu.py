"""The packed NVFP4 GEMM's variants against cuBLAS bf16 on the GPU (issue 18): time, bit-identity of rows
across row counts, error against float64, and the MoE decode layer; prints the variant table to record.

For dense 8192x7168 and 7168x8192 (``[N, K]`` weights) at M = 1 … 4096 every variant of
``kernels/gpu/gemm.py`` ``VARIANTS`` is timed beside ``x @ W.T`` in bf16 (CUDA-graph replay, cold L2:
``benchmarks.kernels_gpu``'s method), its rows are compared bit for bit with the same rows of the 4096-row
product, and that product with float64 ``dequantize(x̂) @ dequantize(Ŵ).T``. A variant that fails to compile
or run is recorded with its error and the rest go on. The MoE layer decode (batch 64,
``benchmarks.kernels_gpu.bench_moe``) runs once per variant. The kernel this replaces is not in the tree
any more: its figures on the same machine and shapes are those recorded by ``benchmarks.kernels_gpu``
(benchmarks/results/h200.json, ``packed_triton_gemm``), reprinted here beside the new ones. Run on the GPU
machine (about 3 minutes on an H200, most of it compiling; ``--only NAME …`` and ``--skip-moe`` trim it):

    python -m benchmarks.nvfp4_gemm_fast_gpu --out benchmarks/results/h200_nvfp4_gemm_fast.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks.kernels_gpu import bench_moe, copies_for, copy_bandwidth, graph_time
from benchmarks.machine import describe
from nibble.kernels import nvfp4
from nibble.kernels.gpu import gemm as gpu_gemm
from nibble.kernels.gpu import row_invariance
from nibble.kernels.tensors import NVFP4Tensor

SHAPES = ((8192, 7168), (7168, 8192))
M_VALUES = (1, 8, 16, 32, 64, 256, 1024, 4096)
DECODE_M = 32  # the table picks the fastest variant over M <= DECODE_M (sampler decode)
MOE_SHAPES = ((1536, 2048), (2048, 768))  # bench_moe's gate_up and down experts
RECORDED_OLD = Path(__file__).parent / "results" / "h200.json"


def _recorded_old() -> dict:
    """``{(n, k, m): seconds}`` of the replaced kernel from benchmarks/results/h200.json, if present."""
    if not RECORDED_OLD.exists():
        return {}
    rows = json.loads(RECORDED_OLD.read_text()).get("dense", [])
    return {(*row["shape"], row["m"]): row["packed_triton_gemm"]["graph_s"] for row in rows}


def _slice(qx: NVFP4Tensor, m: int) -> NVFP4Tensor:
    return NVFP4Tensor(qx.codes[:m], qx.block_scales[:m], qx.global_scale[:m], True, (m, qx.shape[1]))


def _check(qx_all, qw, ref, variant) -> dict:
    """Compile/run ``variant``; its error at the largest M and whether every smaller M gives the same rows."""
    try:
        full = gpu_gemm.packed_matmul(qx_all, qw, torch.float32, variant=variant)
        same = {
            m: bool(
                torch.equal(gpu_gemm.packed_matmul(_slice(qx_all, m), qw, torch.float32, variant=variant), full[:m])
            )
            for m in M_VALUES
        }
        torch.cuda.synchronize()
    except Exception as err:  # a variant that does not compile is a result, not a stop
        return {"error": _error(err)}
    rel = float((full.double() - ref).norm() / ref.norm())
    return {"rel_frobenius_vs_float64": rel, "rows_identical_across_m": all(same.values()), "identical_by_m": same}


def _error(err: Exception) -> str:
    return f"{type(err).__name__}: {str(err)[:400]}"


def bench_shape(n: int, k: int, old: dict) -> dict:
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
    ref = qx_all.dequantize(torch.float64) @ qw.dequantize(torch.float64).T
    result = {"shape": [n, k], "variants": {}, "bf16_cublas": {}, "old_kernel_recorded": {}}
    for variant in gpu_gemm.VARIANTS:
        t0 = time.perf_counter()
        check = _check(qx_all, qw, ref, variant)
        check["compile_and_check_s"] = time.perf_counter() - t0
        result["variants"][variant.name] = {**check, "by_m": {}}
        status = check.get("error") or (
            f"err {check['rel_frobenius_vs_float64']:.1e}, rows identical across M: {check['rows_identical_across_m']}"
        )
        print(f"{n}x{k} {variant.name}: {status}", flush=True)
    del ref
    for m in M_VALUES:
        x, qx = x_all[:m], _slice(qx_all, m)
        iters = 20 if m <= 256 else 3
        bf16 = graph_time(lambda i, x=x: x @ ws[i].T, len(ws), iters)
        result["bf16_cublas"][m] = bf16
        line = f"{n}x{k} M={m:5d} bf16 {bf16['graph_s'] * 1e6:8.1f} us"
        if (n, k, m) in old:
            result["old_kernel_recorded"][m] = old[(n, k, m)]
            line += f" | old(recorded) {old[(n, k, m)] * 1e6:7.1f} us x{bf16['graph_s'] / old[(n, k, m)]:.2f}"
        for variant in gpu_gemm.VARIANTS:
            entry = result["variants"][variant.name]
            if "error" in entry:
                continue
            try:
                t = graph_time(
                    lambda i, qx=qx, v=variant: gpu_gemm.packed_matmul(qx, qws[i], torch.bfloat16, variant=v),
                    len(qws),
                    iters,
                )
            except Exception as err:  # recorded; the other variants go on
                entry["by_m"][m] = {"error": _error(err)}
                line += f" | {variant.name} FAILED"
                continue
            entry["by_m"][m] = {**t, "speedup_vs_bf16": bf16["graph_s"] / t["graph_s"]}
            if m in result["old_kernel_recorded"]:
                entry["by_m"][m]["speedup_vs_old_recorded"] = result["old_kernel_recorded"][m] / t["graph_s"]
            line += f" | {variant.name} {t['graph_s'] * 1e6:7.1f} x{entry['by_m'][m]['speedup_vs_bf16']:.2f}"
        print(line, flush=True)
    result["row_tiles"] = {m: row_invariance.row_tile(m, torch.device("cuda")) for m in M_VALUES}
    result["fastest_at_decode"] = _fastest(result["variants"])
    return result


def _fastest(variants: dict) -> str | None:
    """The variant with the least summed time over M <= DECODE_M among those within 1e-4 of float64 and
    with bit-identical rows at every M (only such a variant may serve a shape)."""
    ok = {
        name: sum(r["graph_s"] for m, r in v["by_m"].items() if m <= DECODE_M)
        for name, v in variants.items()
        if "error" not in v
        and v["rows_identical_across_m"]
        and v["rel_frobenius_vs_float64"] < 1e-4
        and not any("error" in r for r in v["by_m"].values())
    }
    return min(ok, key=ok.get) if ok else None


def bench_moe_variants(copy_bw: float) -> dict:
    """``bench_moe(64)`` with both expert shapes run by each variant in turn (the table restored after)."""
    saved = dict(gpu_gemm.SHAPE_VARIANT)
    out = {}
    try:
        for variant in gpu_gemm.VARIANTS:
            if variant.planar_from:  # decode rows per expert never reach it: the same run as without
                continue
            gpu_gemm.SHAPE_VARIANT.update({shape: variant for shape in MOE_SHAPES})
            print(f"MoE decode with {variant.name}:", flush=True)
            try:
                out[variant.name] = bench_moe(64, copy_bw)
            except Exception as err:  # recorded; the next variant goes on
                out[variant.name] = {"error": f"{type(err).__name__}: {str(err)[:400]}"}
                print(f"  {out[variant.name]['error']}", flush=True)
    finally:
        gpu_gemm.SHAPE_VARIANT.clear()
        gpu_gemm.SHAPE_VARIANT.update(saved)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/h200_nvfp4_gemm_fast.json"))
    parser.add_argument("--only", nargs="*", default=None, help="variant names to run (default: all VARIANTS)")
    parser.add_argument("--skip-moe", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/nvfp4_gemm_fast_gpu.py needs a CUDA GPU")
    start = time.perf_counter()
    if args.only is not None:
        gpu_gemm.VARIANTS = tuple(v for v in gpu_gemm.VARIANTS if v.name in args.only)
    copy_bw = copy_bandwidth()
    result = {
        "machine": describe(),
        "command": "python -m benchmarks.nvfp4_gemm_fast_gpu",
        "copy_bandwidth_Bps": copy_bw,
        "variants": [v.name for v in gpu_gemm.VARIANTS],
        "default_variant": gpu_gemm.DEFAULT_VARIANT.name,
        "dense": [bench_shape(n, k, _recorded_old()) for n, k in SHAPES],
    }
    result["moe_decode_64"] = {} if args.skip_moe else bench_moe_variants(copy_bw)
    moe_ok = {name: r["speedup"] for name, r in result["moe_decode_64"].items() if "speedup" in r}
    result["fastest_moe_decode"] = max(moe_ok, key=moe_ok.get) if moe_ok else None
    result["seconds"] = time.perf_counter() - start
    print("variant table to record in kernels/gpu/gemm.py (SHAPE_VARIANT; rows bit-identical across M):")
    for entry in result["dense"]:
        print(f"  {tuple(entry['shape'])}: {entry['fastest_at_decode']}")
    print(f"  MoE experts {MOE_SHAPES}: {result['fastest_moe_decode']} (x{moe_ok.get(result['fastest_moe_decode'])})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {args.out} in {result['seconds']:.0f} s")


if __name__ == "__main__":
    main()
