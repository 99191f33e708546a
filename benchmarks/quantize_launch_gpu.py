"""The NVFP4 quantise kernel on the GPU: time against copy bandwidth, the four-over-six cost ratio and bit
identity with the torch reference, for every quantise of ``benchmarks.kernels_gpu`` (its activations and
weights, per token and per tensor), plus a launch sweep (elements per chunk × warps) on its 8192×7168
bf16 per-token activation. Method of ``benchmarks.kernels_gpu``: CUDA-graph replay, cold L2 where the
tensor is large, copy bandwidth measured in the same run. A variant that fails to compile or differs from
the reference is recorded as such and the run goes on. Issue 18's targets (8192×7168): standard ≥ 0.7 of
copy bandwidth, four-over-six ≤ 1.5× the standard time. Run on the GPU machine (about 3 minutes):

    python -m benchmarks.quantize_launch_gpu --out benchmarks/results/h200_quantize_launch.json

The figures of the previous results file at ``--out`` (if any) are printed next to the new ones.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from benchmarks.kernels_gpu import copies_for, copy_bandwidth, graph_time
from benchmarks.machine import describe, write_record
from nibble.kernels import nvfp4
from nibble.kernels.gpu import nvfp4 as gpu_nvfp4

MAIN = (8192, 7168)
# (name, shape, per_token): kernels_gpu's quantise, its dense GEMM activations and weights, its MoE layer's
# activations, hidden states and stacked expert weights (one row per expert: rows longer than a program)
CASES = (
    [("activation", MAIN, True)]
    + [(f"dense_x_m{m}_k{k}", (m, k), True) for k in (7168, 4096) for m in (1, 32)]
    + [("dense_w_8192x7168", (8192, 7168), False), ("dense_w_4096x4096", (4096, 4096), False)]
    + [(f"moe_x_{t}", (t, 2048), True) for t in (64, 4096)]
    + [(f"moe_h_{t}", (t * 8, 768), True) for t in (64, 4096)]
    + [("moe_w_gate_up", (128, 2 * 768 * 2048), True), ("moe_w_down", (128, 2048 * 768), True)]
)
MODES = (("standard", None), ("four_over_six_mse", "mse"), ("four_over_six_mae", "mae"))
LAUNCHES = ((512, 1), (1024, 1), (1024, 2), (2048, 2), (2048, 4), (4096, 4), (4096, 8))
MAX_COPIES = 64


def moved_bytes(m: int, k: int, per_token: bool) -> int:
    """bf16 in; codes, block-scale bytes and decode scales out."""
    return m * k * 2 + m * k // 2 + m * k // 16 + (m if per_token else 1) * 4


def same_as_reference(x: torch.Tensor, per_token: bool, fos: str | None, launch) -> bool:
    scale = "per_token" if per_token else "per_tensor"
    ref, ref_map = nvfp4.quantize_with_choices(x, scale=scale, four_over_six=fos, backend="reference")
    out, out_map = gpu_nvfp4.quantize(x, per_token=per_token, four_over_six=fos, with_choices=True, launch=launch)
    pairs = [(ref.codes, out.codes), (ref.block_scales, out.block_scales)]
    pairs += [(ref.global_scale.reshape(-1), out.global_scale.reshape(-1)), (ref_map, out_map)]
    return all(torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)) for a, b in pairs)


def measure(xs: list[torch.Tensor], per_token: bool, fos: str | None, launch, copy_bw: float) -> dict:
    """One variant: time, fraction of copy bandwidth and bit identity; ``{"error": ...}`` if it fails."""
    m, k = xs[0].shape
    try:
        identical = same_as_reference(xs[0], per_token, fos, launch)
        t = graph_time(
            lambda i: gpu_nvfp4.quantize(xs[i], per_token=per_token, four_over_six=fos, launch=launch),
            len(xs),
            iters=20 if m * k >= 1 << 22 else 5,
        )
    except Exception as error:  # a launch the compiler refuses (registers, shared memory), or a bug
        return {"error": f"{type(error).__name__}: {str(error)[:300]}"}
    return {**t, "fraction_of_copy": moved_bytes(m, k, per_token) / t["graph_s"] / copy_bw, "bit_identical": identical}


def _line(what: str, row: dict, previous: dict | None = None) -> str:
    if "error" in row:
        return f"{what}: FAILED {row['error'][:160]}"
    was = f" (was {previous['graph_s'] * 1e6:.1f} us)" if previous and "graph_s" in previous else ""
    return (
        f"{what}: {row['graph_s'] * 1e6:8.1f} us{was}  {row['fraction_of_copy']:.2f} of copy  "
        f"bit-identical {row['bit_identical']}"
    )


def _previous_default(old: dict, mode: str) -> dict | None:
    """The previous file's figure for ``mode`` at the main shape with the launch of that time."""
    rows = old.get(mode) or old.get("sweep", {}).get(mode) or []
    return next((r for r in rows if r.get("default")), None) or (
        min(rows, key=lambda r: r.get("graph_s", 1e9)) if rows else None
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/quantize_launch_gpu.py needs a CUDA GPU")
    old = json.loads(args.out.read_text()) if args.out and args.out.exists() else {}
    torch.manual_seed(0)
    copy_bw = copy_bandwidth()
    print(f"device copy bandwidth {copy_bw / 1e12:.2f} TB/s", flush=True)
    result = {
        "machine": describe(),
        "command": "python -m benchmarks.quantize_launch_gpu",
        "copy_bandwidth_Bps": copy_bw,
    }
    result["targets"] = {
        "standard_fraction_of_copy": ">= 0.7",
        "four_over_six_time_ratio": "<= 1.5",
        "shape": list(MAIN),
    }

    cases = []
    for name, (m, k), per_token in CASES:
        copies = min(MAX_COPIES, copies_for(m * k * 2))
        xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        row = {"name": name, "shape": [m, k], "per_token": per_token}
        for mode, fos in MODES if name == "activation" else MODES[:2]:  # mae costs as mse: once is enough
            row[mode] = measure(xs, per_token, fos, None, copy_bw)
            print(_line(f"{name:22s} {mode:18s}", row[mode]), flush=True)
        if "graph_s" in row["standard"]:
            for mode, _ in MODES[1:]:
                if "graph_s" in row.get(mode, {}):
                    row[f"{mode}_time_ratio"] = row[mode]["graph_s"] / row["standard"]["graph_s"]
        cases.append(row)
        del xs
    result["cases"] = cases

    m, k = MAIN
    xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies_for(m * k * 2))]
    sweep = {}
    for mode, fos in MODES[:2]:
        sweep[mode] = []
        for chunk, warps in LAUNCHES:
            row = {
                "chunk_elements": chunk,
                "num_warps": warps,
                "default": (chunk, warps) == gpu_nvfp4.LAUNCH[bool(fos)],
            }
            row.update(measure(xs, True, fos, (chunk, warps), copy_bw))
            sweep[mode].append(row)
            print(_line(f"sweep {mode:18s} chunk {chunk:5d} warps {warps:2d}", row), flush=True)
    result["sweep"] = sweep

    main_case = cases[0]
    summary = {}
    for mode, _ in MODES[:2]:
        summary[mode] = main_case[mode]
        print(_line(f"SUMMARY {mode:18s} default launch", main_case[mode], _previous_default(old, mode)), flush=True)
    ratio = main_case.get("four_over_six_mse_time_ratio")
    best = {
        mode: min((r for r in sweep[mode] if "graph_s" in r), key=lambda r: r["graph_s"], default=None)
        for mode in sweep
    }
    summary["four_over_six_time_ratio"] = ratio
    summary["best_launch"] = {
        mode: r and [r["chunk_elements"], r["num_warps"], r["graph_s"]] for mode, r in best.items()
    }
    summary["all_bit_identical"] = all(
        c[mode].get("bit_identical", False) for c in cases for mode, _ in MODES if mode in c
    ) and all(r.get("bit_identical", False) for rows in sweep.values() for r in rows)
    result["summary"] = summary
    print(f"SUMMARY 4/6 time ratio {ratio if ratio is None else round(ratio, 2)} (target <= 1.5); "
          f"best launches {summary['best_launch']}; all bit-identical: {summary['all_bit_identical']}")  # fmt: skip
    if args.out:
        write_record(args.out, result)


if __name__ == "__main__":
    main()
