"""Candidate fast NVFP4 GEMM backends on the GPU, measured beside cuBLAS bf16 and Nibble's Triton kernel.

The candidate is humming-kernels (Apache-2.0; JIT-compiled BF16×FP4 GEMMs with (16, E4M3) block scales,
i.e. NVFP4 weights). Nibble's emulated W4A4 maps onto BF16×FP4 exactly: a quantised activation element
(E2M1 value × E4M3 block scale) is exact in bf16, the weight's global scale is humming's
``weight_scale_2``, and the activation's per-token global scale multiplies the output rows. For each M
this records, in one run: time per GEMM under CUDA-graph replay with a cold L2 (``benchmarks.kernels_gpu``'s
method), the error against float64 computed from the same codes and scales, and whether each output row
is the same bits whatever the batch (the row invariance that lets the sampler's logprobs equal the
trainer's, README "Policy model and precision plan"). Run on the GPU machine with humming installed:

    python -m benchmarks.nvfp4_backends_gpu --out benchmarks/results/h200_nvfp4_backends.json
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks.kernels_gpu import copies_for, graph_time
from benchmarks.machine import describe, write_record
from nibble.kernels import nvfp4
from nibble.kernels.gpu import gemm as gpu_gemm
from nibble.kernels.tensors import NVFP4Tensor

M_VALUES = (1, 2, 4, 8, 16, 32, 128, 1024)


def unscaled(q: NVFP4Tensor) -> torch.Tensor:
    """``e2m1 · block_scale`` of ``q`` in bf16 (exact: at most 5 significant bits), without the global scale."""
    return q.unscaled().dequantize(torch.bfloat16)


def exact(q: NVFP4Tensor) -> torch.Tensor:
    """The float64 values of ``q`` (codes × block scales × global scale, no rounding)."""
    g = q.global_scale.to(torch.float64)
    return unscaled(q).to(torch.float64) * (g[..., None] if g.dim() else g)


def humming_layer(qw: NVFP4Tensor):
    """A humming layer holding ``qw`` in ModelOpt's NVFP4 names (decode global scale ``weight_scale_2``)."""
    from humming.layer import HummingLayer

    n, k = qw.shape
    schema = {"quant_method": "modelopt", "quant_algo": "NVFP4"}
    layer = HummingLayer(shape_n=n, shape_k=k, weight_config=schema, torch_dtype=torch.bfloat16)
    tensors = {"weight": qw.codes, "weight_scale": qw.block_scales, "weight_scale_2": qw.global_scale.reshape(1)}
    layer.load_from_tensors({name: t.cpu() for name, t in tensors.items()})
    layer = layer.cuda()
    layer.transform()
    return layer


def humming_matmul(layer, a: torch.Tensor, g: torch.Tensor, batch_invariant: bool) -> torch.Tensor:
    """``a`` = :func:`unscaled` activations ``[M, K]`` bf16, ``g`` their per-token global scales ``[M]``."""
    config = {"use_batch_invariant": True} if batch_invariant else None
    y = layer(a, compute_config=config)
    return (y.to(torch.float32) * g[:, None]).to(torch.bfloat16)


def rel_frobenius(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.to(torch.float64) - ref).norm() / ref.norm())


def _row(m, x, qx_all, ref, full, ws, qws, layers) -> dict:
    """One M: times, errors against float64 and row invariance of each backend."""
    k = x.shape[1]
    qx = NVFP4Tensor(qx_all.codes[:m], qx_all.block_scales[:m], qx_all.global_scale[:m], True, (m, k))
    a, g = unscaled(qx), qx.global_scale
    outs = {
        "triton": gpu_gemm.packed_matmul(qx, qws[0], torch.float32),
        "humming": humming_matmul(layers[0], a, g, False),
        "humming_batch_invariant": humming_matmul(layers[0], a, g, True),
    }
    times = {
        "bf16_cublas": graph_time(lambda i: x @ ws[i].T, len(ws)),
        "triton": graph_time(lambda i: gpu_gemm.packed_matmul(qx, qws[i], torch.bfloat16), len(qws)),
        "humming": graph_time(lambda i: humming_matmul(layers[i], a, g, False), len(layers)),
        "humming_batch_invariant": graph_time(lambda i: humming_matmul(layers[i], a, g, True), len(layers)),
    }
    row = {"m": m, "times": times}
    for name, y in outs.items():
        row[name] = {
            "rel_frobenius_vs_float64": rel_frobenius(y, ref),
            "rows_equal_to_batch_of_1024": bool(torch.equal(y, full[name][:m])),
            "speedup_vs_bf16": times["bf16_cublas"]["graph_s"] / times[name]["graph_s"],
        }
    print(
        f"M={m:5d} bf16 {times['bf16_cublas']['graph_s'] * 1e6:7.1f} us | "
        + " | ".join(
            f"{name} {times[name]['graph_s'] * 1e6:7.1f} us x{row[name]['speedup_vs_bf16']:.2f} "
            f"err {row[name]['rel_frobenius_vs_float64']:.1e} row-inv {row[name]['rows_equal_to_batch_of_1024']}"
            for name in outs
        ),
        flush=True,
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--k", type=int, default=7168)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    n, k = args.n, args.k
    torch.manual_seed(0)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    qw = nvfp4.quantize(w, scale="per_tensor", four_over_six="mse", validate=False)
    x_all = torch.randn(max(M_VALUES), k, device="cuda", dtype=torch.bfloat16)
    qx_all = nvfp4.quantize(x_all, scale="per_token", four_over_six="mse", validate=False)
    ref_all = exact(qx_all) @ exact(qw).T

    start = time.perf_counter()
    layers = [humming_layer(qw)]
    full = {
        "triton": gpu_gemm.packed_matmul(qx_all, qw, torch.float32),
        "humming": humming_matmul(layers[0], unscaled(qx_all), qx_all.global_scale, False),
        "humming_batch_invariant": humming_matmul(layers[0], unscaled(qx_all), qx_all.global_scale, True),
    }
    torch.cuda.synchronize()
    first_call_s = time.perf_counter() - start  # JIT compilation of humming's kernels included
    copies = copies_for(qw.nbytes)
    layers += [humming_layer(qw) for _ in range(copies - 1)]
    ws = [w.clone() for _ in range(copies_for(n * k * 2))]
    qws = [
        NVFP4Tensor(qw.codes.clone(), qw.block_scales.clone(), qw.global_scale.clone(), True, qw.shape)
        for _ in range(copies)
    ]
    rows = [_row(m, x_all[:m], qx_all, ref_all[:m], full, ws, qws, layers) for m in M_VALUES]
    result = {
        "machine": describe(),
        "command": "python -m benchmarks.nvfp4_backends_gpu",
        "shape": [n, k],
        "humming_version": __import__("humming").__version__,
        "humming_first_calls_s": first_call_s,
        "rows": rows,
    }
    if args.out:
        write_record(args.out, result)


if __name__ == "__main__":
    main()
