"""NVFP4 Triton kernels against bf16 on the GPU: quantise, dense GEMM, grouped MoE layer, memory.

Every figure is measured in this one run, side by side, with CUDA events under CUDA-graph replay (and,
for reference, plain launches), after warm-up, with a cold L2: each timed graph cycles through copies
of its weights/inputs totalling more than 200 MB (the H200's L2 holds 50 MB). Run on the GPU machine:

    python -m benchmarks.kernels_gpu --out benchmarks/results/h200.json
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.machine import describe, out_problem, write_record
from benchmarks.options import AddUp
from nibble.kernels import gemm, nvfp4
from nibble.kernels.gpu import fragment_gemm
from nibble.kernels.gpu import gemm as gpu_gemm
from nibble.kernels.tensors import NVFP4Tensor

ROTATE_BYTES = 256 * 2**20


def graph_time(fn, copies: int, iters: int = 20) -> dict:
    """Mean seconds per call of ``fn(i)`` (``i`` picks the copy): CUDA-graph replay and plain launches."""
    for i in range(copies):  # warm-up, autotuning
        fn(i)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        for _ in range(iters):
            for i in range(copies):
                fn(i)
    torch.cuda.synchronize()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    torch.cuda.synchronize()
    replay = start.elapsed_time(end) / 1e3 / (iters * copies)
    start.record()
    for _ in range(iters):
        for i in range(copies):
            fn(i)
    end.record()
    torch.cuda.synchronize()
    plain = start.elapsed_time(end) / 1e3 / (iters * copies)
    return {"graph_s": replay, "launch_s": plain}


def copies_for(nbytes: int) -> int:
    return max(1, -(-ROTATE_BYTES // max(1, nbytes)))


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth, bytes read + written per second."""
    n = 1 << 30
    src, dst = torch.empty(n, dtype=torch.uint8, device="cuda"), torch.empty(n, dtype=torch.uint8, device="cuda")
    t = graph_time(lambda i: dst.copy_(src), 1, iters=10)["graph_s"]
    return 2 * n / t


def bench_quantize(copy_bw: float) -> dict:
    m, k = 8192, 7168
    xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies_for(m * k * 2))]
    moved = m * k * 2 + m * k // 2 + m * k // 16 + m * 4  # bf16 in; codes, block scales, global scales out
    out = {}
    for name, fos in (("standard", None), ("four_over_six_mse", "mse")):
        t = graph_time(
            lambda i, fos=fos: nvfp4.quantize(xs[i], scale="per_token", four_over_six=fos, validate=False), len(xs)
        )
        out[name] = {**t, "bandwidth_Bps": moved / t["graph_s"], "fraction_of_copy": moved / t["graph_s"] / copy_bw}
    out["four_over_six_time_ratio"] = out["four_over_six_mse"]["graph_s"] / out["standard"]["graph_s"]
    out["targets"] = {"standard_fraction_of_copy": ">= 0.7", "four_over_six_time_ratio": "<= 1.5"}
    return out


def dense_weights(n: int, k: int) -> tuple[list[torch.Tensor], list[NVFP4Tensor]]:
    """Copies (enough for a cold L2) of one random bf16 weight ``[n, k]`` and of its NVFP4 quantisation in the
    sampler's form: packed codes and scales plus their fragment layout (nibble.recipe.quant.sampler_form)."""
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    ws = [w.clone() for _ in range(copies_for(n * k * 2))]
    qw0 = nvfp4.quantize(w, scale="per_tensor", four_over_six="mse", validate=False)
    qws = [
        gemm.with_fragments(
            NVFP4Tensor(qw0.codes.clone(), qw0.block_scales.clone(), qw0.global_scale.clone(), True, qw0.shape)
        )
        for _ in range(copies_for(qw0.nbytes))
    ]
    return ws, qws


def bench_dense(n: int, k: int) -> list[dict]:
    rows = []
    ws, qws = dense_weights(n, k)
    for m in (1, 8, 32, 128, 1024, 8192):
        rows.append(_dense_row(m, n, k, ws, qws))
    return rows


def _dense_row(m: int, n: int, k: int, ws: list[torch.Tensor], qws: list[NVFP4Tensor]) -> dict:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    qx = nvfp4.quantize(x, scale="per_token", four_over_six="mse", validate=False)

    def quantize_and_gemm(i: int) -> torch.Tensor:
        # as the sampler quantises: the GEMM's operand written by the quantise kernel
        qx_i = nvfp4.quantize(x, scale="per_token", four_over_six="mse", validate=False, gemm_operand=True)
        return gemm.matmul(qx_i, qws[i], out_dtype=torch.bfloat16)

    bf16 = graph_time(lambda i: x @ ws[i].T, len(ws))
    kernel = graph_time(lambda i: gemm.matmul(qx, qws[i], out_dtype=torch.bfloat16), len(qws))
    fused = graph_time(quantize_and_gemm, len(qws))
    # the portable Triton kernel (one dot per block) only where it is not far behind: it serves GPUs the CUDA
    # kernels do not compile on
    packed = graph_time(lambda i: gpu_gemm.packed_matmul(qx, qws[i], torch.bfloat16), len(qws)) if m <= 128 else None
    decoded = graph_time(lambda i: gpu_gemm.dequantized_matmul(qx, qws[i], torch.bfloat16), len(qws))
    row = {
        "shape": [n, k],
        "m": m,
        "bf16": bf16,
        "nvfp4_gemm": kernel,
        "nvfp4_quantize_and_gemm": fused,
        "packed_triton_gemm": packed,
        "dequantize_then_cublas": decoded,
        "speedup_gemm": bf16["graph_s"] / kernel["graph_s"],
        "speedup_quantize_and_gemm": bf16["graph_s"] / fused["graph_s"],
        "path": _dense_path(m, n),
    }
    print(
        f"dense {n}x{k} M={m:5d}: bf16 {bf16['graph_s'] * 1e6:8.1f} us  nvfp4 {kernel['graph_s'] * 1e6:8.1f} us "
        f"(x{row['speedup_gemm']:.2f})  +quant {fused['graph_s'] * 1e6:8.1f} us "
        f"(x{row['speedup_quantize_and_gemm']:.2f})  [{row['path']}; triton "
        f"{packed['graph_s'] * 1e6 if packed else float('nan'):.1f} us, decoded {decoded['graph_s'] * 1e6:.1f} us]",
        flush=True,
    )
    return row


def _dense_path(m: int, n: int) -> str:
    gemv = gpu_gemm.dense_gemv(m, n, fragment_gemm.shared_limit(torch.device("cuda")))
    return "CUDA fragment gemv" if gemv else "CUDA fragment gemm"


def bench_moe(tokens: int, copy_bw: float) -> dict:
    e, top_k, hidden, inter = 128, 8, 2048, 768
    gen = torch.Generator(device="cuda").manual_seed(0)
    w_gu = torch.randn(e, 2 * inter, hidden, device="cuda", dtype=torch.bfloat16, generator=gen) / hidden**0.5
    w_dn = torch.randn(e, hidden, inter, device="cuda", dtype=torch.bfloat16, generator=gen) / inter**0.5
    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16, generator=gen)
    logits = torch.randn(tokens, e, device="cuda", generator=gen)
    chosen = logits.topk(top_k, dim=-1).indices.reshape(-1)
    order = torch.argsort(chosen, stable=True)
    experts, token_rows = chosen[order], order // top_k
    counts = torch.bincount(experts, minlength=e)
    offs = torch.cumsum(counts, 0).to(torch.int32)

    def stack(w):
        flat = nvfp4.quantize(w.reshape(e, -1), scale="per_token", four_over_six="mse", validate=False)
        return NVFP4Tensor(
            flat.codes.reshape(*w.shape[:-1], w.shape[-1] // 2),
            flat.block_scales.reshape(*w.shape[:-1], w.shape[-1] // 16),
            flat.global_scale,
            True,
            w.shape,
        )

    q_gu, q_dn = gemm.with_fragments(stack(w_gu)), gemm.with_fragments(stack(w_dn))  # the sampler's form

    def nvfp4_layer(_):
        qx = nvfp4.quantize(x, scale="per_token", four_over_six="mse", validate=False)
        gate, up = gemm.grouped_matmul(qx, q_gu, experts, token_rows, out_dtype=torch.bfloat16, validate=False).chunk(
            2, -1
        )
        qh = nvfp4.quantize(F.silu(gate) * up, scale="per_token", four_over_six="mse", validate=False)
        return gemm.grouped_matmul(qh, q_dn, experts, out_dtype=torch.bfloat16, validate=False)

    w_gu_t, w_dn_t = w_gu.transpose(1, 2), w_dn.transpose(1, 2)
    bf16_path = "torch._grouped_mm"
    try:
        torch._grouped_mm(x[token_rows], w_gu_t, offs=offs)
    except (AttributeError, RuntimeError) as err:
        bf16_path = f"sorted per-expert loop ({type(err).__name__})"

    def bf16_layer(_):
        xs = x[token_rows]
        if bf16_path == "torch._grouped_mm":
            gate, up = torch._grouped_mm(xs, w_gu_t, offs=offs).chunk(2, -1)
            return torch._grouped_mm(F.silu(gate) * up, w_dn_t, offs=offs)
        outs, start = [], 0
        for i, c in enumerate(counts.tolist()):
            if c:
                gate, up = (xs[start : start + c] @ w_gu[i].T).chunk(2, -1)
                outs.append((F.silu(gate) * up) @ w_dn[i].T)
                start += c
        return torch.cat(outs)

    used = int((counts > 0).sum())
    nvfp4_t = graph_time(nvfp4_layer, 1, iters=20)
    bf16_t = graph_time(bf16_layer, 1, iters=20) if bf16_path == "torch._grouped_mm" else _plain(bf16_layer)
    expert_bytes_nvfp4 = used * (q_gu.nbytes + q_dn.nbytes) // e
    expert_bytes_bf16 = used * (w_gu.numel() + w_dn.numel()) * 2 // e
    out = {
        "tokens": tokens,
        "experts_used": used,
        "nvfp4_path": "CUDA fragment gemv"
        if tokens * top_k / e <= gpu_gemm.GROUPED_CROSSOVER_ROWS
        else "CUDA fragment gemm",
        "bf16_path": bf16_path,
        "bf16": bf16_t,
        "nvfp4": nvfp4_t,
        "speedup": bf16_t["graph_s"] / nvfp4_t["graph_s"],
        "nvfp4_expert_bytes_read": expert_bytes_nvfp4,
        "nvfp4_fraction_of_copy": expert_bytes_nvfp4 / nvfp4_t["graph_s"] / copy_bw,
        "bf16_fraction_of_copy": expert_bytes_bf16 / bf16_t["graph_s"] / copy_bw,
        "resident_expert_bytes": {"nvfp4": q_gu.nbytes + q_dn.nbytes, "bf16": (w_gu.numel() + w_dn.numel()) * 2},
    }
    out["resident_ratio"] = out["resident_expert_bytes"]["nvfp4"] / out["resident_expert_bytes"]["bf16"]
    print(
        f"MoE tokens={tokens}: bf16 [{bf16_path}] {bf16_t['graph_s'] * 1e3:.3f} ms  "
        f"nvfp4 {nvfp4_t['graph_s'] * 1e3:.3f} ms "
        f"(x{out['speedup']:.2f}); nvfp4 {out['nvfp4_fraction_of_copy']:.2f} of copy bandwidth",
        flush=True,
    )
    return out


def _plain(fn) -> dict:
    fn(0)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        fn(0)
    torch.cuda.synchronize()
    s = (time.perf_counter() - t0) / 10
    return {"graph_s": s, "launch_s": s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/h200.json"))
    parser.add_argument("--skip", action=AddUp, default=[], choices=["quantize", "dense", "moe"])
    args = parser.parse_args()
    if {"quantize", "dense", "moe"} <= set(args.skip):
        parser.error("--skip: skipping quantize, dense and moe leaves nothing to time")
    if problem := out_problem(args.out):
        parser.error(f"--out {args.out}: {problem}")
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/kernels_gpu.py needs a CUDA GPU (it measures the Triton kernels there)")
    torch.manual_seed(0)
    copy_bw = copy_bandwidth()
    print(f"device copy bandwidth {copy_bw / 1e12:.2f} TB/s", flush=True)
    command = "python -m benchmarks.kernels_gpu"
    if args.skip:
        command += " --skip " + " ".join(args.skip)
    result = {"machine": describe(), "copy_bandwidth_Bps": copy_bw, "command": command}
    if "quantize" not in args.skip:
        result["quantize"] = bench_quantize(copy_bw)
        q = result["quantize"]
        print(
            f"quantise 8192x7168 bf16 per-token: standard {q['standard']['graph_s'] * 1e6:.1f} us "
            f"({q['standard']['fraction_of_copy']:.2f} of copy), 4/6 x{q['four_over_six_time_ratio']:.2f}",
            flush=True,
        )
    if "dense" not in args.skip:
        result["dense"] = bench_dense(8192, 7168) + bench_dense(4096, 4096)
    if "moe" not in args.skip:
        result["moe"] = [bench_moe(64, copy_bw), bench_moe(4096, copy_bw)]
    write_record(args.out, result)


if __name__ == "__main__":
    main()
