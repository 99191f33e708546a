"""Sampler decode throughput end to end: NVFP4 vs BF16 on the Qwen3-30B-A3B-shaped model, batch 64.

Both models are the sampler form (``MoETransformer.pack()``) of the same seeded random weights, computing
in bf16. Each decodes ``--steps`` tokens per row after a ``--prompt``-token prefill with a
:class:`~nibble.model.graph_decode.GraphDecoder`: every step replays one CUDA graph over a static KV cache
of ``prompt + steps`` positions. Experts run grouped on both sides without host synchronisation (NVFP4:
the block-ordered GEMMs, on CUDA the fragment kernels; BF16: ``torch._grouped_mm``). Also measured, for
reference: the same static step launched eagerly, and the dynamic step of ``generate()`` (growing cache,
input checks that sync the host). ``--profile N`` also records where a step's GPU time goes: the CUDA kernels
of ``N`` eagerly launched static steps (the kernels a graph replays), by kernel name, in µs per step.

Decode tokens/s = batch x steps / seconds, timed with CUDA events around the whole decode loop (greedy:
the next token is the argmax, computed on the device; sampling and detokenisation are not included).
The model has ``--layers`` decoder layers (default 4) of Qwen3-30B-A3B's dimensions, not its 48 (30 B
parameters); the ratio measures the per-layer decode cost plus the embeddings and LM head (vocab
151936) that a 48-layer model amortises over 12 times more layers. By default every layer's experts are
NVFP4 (``--bf16-last-fraction 0``); the recipe keeps the last 7 of 48 layers in BF16. Run on the GPU:

    python -m benchmarks.sampler_gpu --out benchmarks/results/h200_sampler.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

from benchmarks.machine import describe, out_problem, write_record
from benchmarks.options import AddUp, fraction, non_negative, positive
from nibble.config import PlanConfig
from nibble.kernels.gpu import grouped
from nibble.model import MoETransformer, qwen3_30b_a3b_shaped
from nibble.model.generate import CacheDecoder
from nibble.model.graph_decode import GraphDecoder
from nibble.recipe import PlannedExperts, PrecisionPlan

TARGET_SPEEDUP = 1.5  # issue 18
MODES = ("graph", "eager", "dynamic")


def build(fmt: str, layers: int, bf16_last_fraction: float) -> MoETransformer:
    """The sampler form of seeded random weights (the same weights for either format), built on the GPU."""
    config = qwen3_30b_a3b_shaped(num_layers=layers)
    plan = PrecisionPlan.from_config(PlanConfig(format=fmt, bf16_last_fraction=bf16_last_fraction), layers, "cuda")
    torch.manual_seed(0)
    with torch.device("cuda"):
        return MoETransformer(config, plan).eval().pack()


def expert_bytes(model: MoETransformer) -> int:
    """Bytes of the routed experts' weights as the sampler keeps them (codes and scales plus their fragment
    layout, or bf16)."""
    total = 0
    for module in model.modules():
        if isinstance(module, PlannedExperts):
            if module.packed is not None:
                fragments = sum(q.fragments.nbytes for q in module.packed if q.fragments is not None)
                total += sum(q.nbytes for q in module.packed) + fragments
            else:
                total += sum(w.numel() * w.element_size() for w in (module.gate_up_proj, module.down_proj))
    return total


def decode_seconds(decoder, prompt: torch.Tensor, steps: int) -> float:
    """Seconds for ``steps`` greedy decode steps after a prefill of ``prompt`` int64 ``[B, L]``."""
    running = torch.ones(prompt.shape[0], dtype=torch.bool, device="cuda")
    token = decoder.prefill(prompt, torch.ones_like(prompt, dtype=torch.bool)).argmax(-1)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(steps):
        token = decoder.step(token, running).argmax(-1)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3


def throughput(decoder, prompt: torch.Tensor, steps: int, repeats: int) -> dict:
    """Median over ``repeats`` decodes (after one warm-up decode) of seconds per step and tokens/s."""
    decode_seconds(decoder, prompt, steps)
    seconds = statistics.median(decode_seconds(decoder, prompt, steps) for _ in range(repeats))
    return {"step_s": seconds / steps, "tokens_per_s": prompt.shape[0] * steps / seconds}


def kernel_times(decoder, prompt: torch.Tensor, steps: int, top: int = 25) -> dict:
    """GPU time per decode step by CUDA kernel (µs, the ``top`` largest and the sum of all) over ``steps``
    eager static steps after a prefill, from ``torch.profiler``."""
    from torch.profiler import ProfilerActivity, profile

    running = torch.ones(prompt.shape[0], dtype=torch.bool, device="cuda")
    token = decoder.prefill(prompt, torch.ones_like(prompt, dtype=torch.bool)).argmax(-1)
    token = decoder.step(token, running).argmax(-1)  # warm-up: first-use compilation stays out of the record
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as recording:
        for _ in range(steps):
            token = decoder.step(token, running).argmax(-1)
        torch.cuda.synchronize()
    per_kernel = {
        event.key: event.self_device_time_total / steps
        for event in recording.key_averages()
        if event.self_device_time_total > 0
    }
    ranked = sorted(per_kernel.items(), key=lambda item: -item[1])
    return {"total_us": sum(per_kernel.values()), "top_us": dict(ranked[:top]), "kernels": len(per_kernel)}


@torch.no_grad()
def bench(fmt: str, args: argparse.Namespace) -> dict:
    model = build(fmt, args.layers, args.bf16_last_fraction)
    torch.cuda.reset_peak_memory_stats()  # from here: the sampler's memory, not the float32 masters built first
    cd = model.plan.torch_compute_dtype
    if fmt == "bf16" and not grouped.available(torch.device("cuda"), cd):
        raise SystemExit(
            f"torch {torch.__version__} has no CUDA torch._grouped_mm for {cd}: BF16 cannot decode in a graph"
        )
    prompt = torch.randint(0, model.config.vocab_size, (args.batch, args.prompt), device="cuda")
    max_len = args.prompt + args.steps
    out = {
        "plan": model.plan.model_dump(),
        "expert_path": describe()["nvfp4_gemm"] if fmt == "nvfp4" else "torch._grouped_mm",
        "resident_expert_bytes": expert_bytes(model),
        "resident_bytes": torch.cuda.memory_allocated(),
    }
    decoders = {
        "graph": lambda: GraphDecoder(model, args.batch, max_len),
        "eager": lambda: GraphDecoder(model, args.batch, max_len, graph=False),
        "dynamic": lambda: CacheDecoder(model, args.batch, max_len),
    }
    for mode in args.modes:
        out[mode] = throughput(decoders[mode](), prompt, args.steps, args.repeats)
    # over the timed decodes, their prefills included: the prefill's float32 logits [B, L, V] dominate
    out["decode_peak_bytes"] = torch.cuda.max_memory_allocated()
    if args.profile:
        eager = GraphDecoder(model, args.batch, max_len, graph=False)
        out["kernel_us_per_step"] = kernel_times(eager, prompt, args.profile)
    print(
        f"{fmt:5s} experts {out['resident_expert_bytes'] / 2**30:.2f} GiB: "
        + "  ".join(f"{mode} {out[mode]['tokens_per_s']:9.0f} tok/s" for mode in args.modes),
        flush=True,
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--layers", type=positive, default=4, help="decoder layers of Qwen3-30B-A3B's shape (it has 48)"
    )
    parser.add_argument("--batch", type=positive, default=64, help="rows decoded together")
    parser.add_argument("--prompt", type=positive, default=128, help="prompt tokens per row (random ids)")
    parser.add_argument("--steps", type=positive, default=128, help="decode steps timed per repeat")
    parser.add_argument("--repeats", type=positive, default=3, help="timed decodes per mode (the median is kept)")
    parser.add_argument(
        "--bf16-last-fraction", type=fraction, default=0.0, help="the plan's BF16 tail on the NVFP4 side"
    )
    parser.add_argument(
        "--modes", action=AddUp, default=list(MODES), choices=MODES, help="decode modes timed (graph: the target's)"
    )
    parser.add_argument("--profile", type=non_negative, default=0, help="also record kernel times over this many steps")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/h200_sampler.json"))
    args = parser.parse_args()
    if problem := out_problem(args.out):
        parser.error(f"--out {args.out}: {problem}")
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/sampler_gpu.py needs a CUDA GPU (it measures CUDA-graph decode there)")
    config = qwen3_30b_a3b_shaped(num_layers=args.layers)
    result = {
        "machine": describe(),
        "command": " ".join(["python -m benchmarks.sampler_gpu", *sys.argv[1:]]),
        "model": {
            "shape": "qwen3_30b_a3b_shaped",
            "layers": args.layers,
            "full_model_layers": 48,
            **config.model_dump(),
        },
        "batch": args.batch,
        "prompt_tokens": args.prompt,
        "decode_steps": args.steps,
        "cache_positions": args.prompt + args.steps,
        "repeats": args.repeats,
    }
    for fmt in ("nvfp4", "bf16"):
        result[fmt] = bench(fmt, args)
        torch.cuda.empty_cache()
    result["speedup"] = {m: result["nvfp4"][m]["tokens_per_s"] / result["bf16"][m]["tokens_per_s"] for m in args.modes}
    if "graph" in args.modes:
        met = result["speedup"]["graph"] >= TARGET_SPEEDUP
        result["target"] = {"graph_speedup": f">= {TARGET_SPEEDUP}", "met": met}
    print("NVFP4 / BF16 decode tokens/s: " + "  ".join(f"{m} x{result['speedup'][m]:.2f}" for m in args.modes))
    write_record(args.out, result)


if __name__ == "__main__":
    main()
