"""Decode-size activation quantise on the GPU, alone and in front of the dense NVFP4 GEMM: rows split over
programs and the GEMM operand written by the quantise kernel, against the launch they replace.

A decode step quantises a few rows per product. One program per row group (the launch before, ``split=1``)
leaves most of the GPU idle while each program walks its rows' chunks; ``split`` (the default now) shares a
row's chunks among programs that each reduce its amax. The GEMM then decodes the codes in a launch of its
own, unless the quantise kernel wrote that operand beside them (``gemm_operand``, what the sampler asks
for now). This times, side by side in one run (CUDA-graph replay, method of ``benchmarks.kernels_gpu``):
the quantise at M = 1-64 rows of the sampler's and the dense benchmark's widths, both launches, with and
without the operand; and quantise + GEMM on 8192×7168 (the sampler's packed weight form, cold L2) in the
before / split / split + operand forms, against cuBLAS bf16 on the same rows. Every form is checked to give
the reference's bits (codes, scales, the GEMM's output). Run on the GPU machine (about 2 minutes):

    python -m benchmarks.decode_quantize_gpu --out benchmarks/results/h200_decode_quantize.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from benchmarks.kernels_gpu import dense_weights, graph_time
from benchmarks.machine import describe, write_record
from nibble.kernels import gemm, nvfp4
from nibble.kernels.gpu import nvfp4 as gpu_nvfp4
from nibble.kernels.tensors import NVFP4Tensor

ROWS = (1, 8, 32, 64)
WIDTHS = (2048, 4096, 7168)
WEIGHT = (8192, 7168)
# (name, split, operand): the launch before this change, the split alone, and what the sampler runs now
FORMS = (("one_program_per_rows", 1, False), ("split", None, False), ("split_with_operand", None, True))


def _quantize(x: torch.Tensor, fos: str | None, split: int | None, operand: bool) -> NVFP4Tensor:
    return gpu_nvfp4.quantize(x, per_token=True, four_over_six=fos, split=split, operand=operand)[0]


def _same_codes(x: torch.Tensor, fos: str | None, split: int | None, operand: bool) -> bool:
    ref = nvfp4.quantize(x, scale="per_token", four_over_six=fos, backend="reference")
    out = _quantize(x, fos, split, operand)
    same = torch.equal(ref.codes, out.codes) and torch.equal(ref.global_scale, out.global_scale)
    return same and torch.equal(ref.block_scales.view(torch.uint8), out.block_scales.view(torch.uint8))


def quantize_rows() -> list[dict]:
    rows = []
    for k in WIDTHS:
        for m in ROWS:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            for fos in (None, "mse"):
                row = {"m": m, "k": k, "four_over_six": fos}
                for name, split, operand in FORMS:
                    t = graph_time(lambda i, x=x, f=fos, s=split, o=operand: _quantize(x, f, s, o), 1, iters=50)
                    row[name] = {**t, "bit_identical": _same_codes(x, fos, split, operand)}
                row["speedup_split"] = row["one_program_per_rows"]["graph_s"] / row["split"]["graph_s"]
                rows.append(row)
                print(
                    f"quantise M={m:3d} K={k:5d} {fos or 'standard':8s}: "
                    + "  ".join(f"{n} {row[n]['graph_s'] * 1e6:6.2f} us" for n, _, _ in FORMS),
                    flush=True,
                )
    return rows


def quantize_and_gemm_rows() -> list[dict]:
    n, k = WEIGHT
    ws, qws = dense_weights(n, k)
    rows = []
    for m in (1, 8, 16, 32):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        bf16 = graph_time(lambda i, x=x: x @ ws[i].T, len(ws))
        expected = gemm.matmul(_quantize(x, "mse", 1, False), qws[0], out_dtype=torch.bfloat16)
        row = {"m": m, "shape": [n, k], "bf16": bf16}
        for name, split, operand in FORMS:

            def step(i: int, x=x, split=split, operand=operand) -> torch.Tensor:
                return gemm.matmul(_quantize(x, "mse", split, operand), qws[i], out_dtype=torch.bfloat16)

            out = step(0)
            row[name] = {**graph_time(step, len(qws)), "bit_identical": torch.equal(out, expected)}
            row[name]["speedup_vs_bf16"] = bf16["graph_s"] / row[name]["graph_s"]
        qx = _quantize(x, "mse", None, True)
        alone = graph_time(lambda i, qx=qx: gemm.matmul(qx, qws[i], out_dtype=torch.bfloat16), len(qws))
        row["gemm_alone_with_operand"] = {**alone, "speedup_vs_bf16": bf16["graph_s"] / alone["graph_s"]}
        rows.append(row)
        print(
            f"quantise+GEMM {n}x{k} M={m:2d}: bf16 {bf16['graph_s'] * 1e6:6.1f} us  "
            + "  ".join(
                f"{name} {row[name]['graph_s'] * 1e6:6.1f} us (x{row[name]['speedup_vs_bf16']:.2f})"
                for name, _, _ in FORMS
            )
            + f"  GEMM alone {alone['graph_s'] * 1e6:6.1f} us (x{bf16['graph_s'] / alone['graph_s']:.2f})",
            flush=True,
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/decode_quantize.json"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("decode_quantize_gpu needs a CUDA GPU")
    record = {"machine": describe(), "quantize": quantize_rows(), "quantize_and_gemm": quantize_and_gemm_rows()}
    rows = record["quantize"] + record["quantize_and_gemm"]
    record["all_bit_identical"] = all(row[name]["bit_identical"] for row in rows for name, _, _ in FORMS)
    write_record(args.out, record)
    if not record["all_bit_identical"]:
        raise SystemExit("a form gave other bits than the reference (see the record)")


if __name__ == "__main__":
    main()
