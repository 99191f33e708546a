"""Trainer throughput, FSDP2-sharded over N GPUs against one GPU, on the Qwen3-30B-A3B-shaped model.

For each N in ``--gpus`` this starts ``torchrun --nproc-per-node N`` on this file's worker, which builds
the model with Qwen3-30B-A3B's layer dimensions (hidden 2048, 128 experts top-8, expert width 768,
vocabulary 151936) and ``--layers`` decoder layers, the run's default precision plan (NVFP4 experts,
per-token activation scales, 4/6, dequantised backward, last 15% of layers BF16; compute in bf16 on
CUDA), and trains it with the trainer's own ``train_on_batch`` on synthetic batches of whole GRPO groups
(random tokens, rewards and sampler logprobs):

- strong scaling: ``--groups`` groups per step at every N; weak scaling: ``--groups`` per baseline
  process, so ``--groups · N / first`` at N (the first count of ``--gpus`` is the baseline);
- each measurement is ``--warmup`` untimed steps then ``--steps`` timed ones (synchronised around each
  step), and the whole set of measurements is repeated ``--repeats`` times in the same processes,
  interleaved (repeat 1: strong, weak; repeat 2: strong, weak), so drift shows as spread between repeats;
- per measurement: median step time with its interquartile range and min/max, trained (valid response)
  tokens/s, and model FLOPs utilisation per GPU (MFU); per N: the repeats' medians and their spread
  ((max − min) / mean); the scaling ratios per repeat; each rank's peak GPU memory;
- ``--profile`` records one more step with ``torch.profiler`` and prints where its time goes
  (:mod:`benchmarks.profile_summary`: forward, π_old, backward, optimiser, FSDP all-gather and
  reduce-scatter, host gaps).

MFU: model FLOPs per step / (median step seconds · N · peak), with the peak an H200's dense bf16
tensor-core rate, 989 TFLOP/s (the NVFP4 experts run on bf16 tensor cores on Hopper: weights are decoded
in registers). Model FLOPs per step = 4 × one forward over every row's prompt + response tokens (π_old's
forward, π_θ's forward, its backward at twice the forward; padding not counted), where one forward is
2 · tokens · (the multiply-adds per token of every projection a token passes through: attention q/k/v/o,
router, its top-k routed experts' gate/up/down, shared expert, dense MLPs, LM head) plus causal
attention, 2 · 2 · heads · head_dim · S(S+1)/2 per layer for a sequence of S tokens.

Run on a machine with 2 GPUs (under 10 minutes with the defaults at the 2026-11-29 step times; it writes
``benchmarks/results/h200x2_sharded_trainer_grouped.json``):

    python -m benchmarks.sharded_trainer --gpus 1,2 --profile

``--device cpu --model tiny`` runs the same code on CPU processes (gloo), to check the script.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.machine import describe, write_record

GPU_RESULTS = Path("benchmarks/results/h200x2_sharded_trainer_grouped.json")
PEAK_FLOPS = {"cuda": 989e12}  # H200 SXM dense bf16 tensor-core peak (NVIDIA's datasheet: 1,979 with sparsity)


def _model(kind: str, layers: int, device: str):
    from nibble.config import PlanConfig
    from nibble.model import MoETransformer, qwen3_30b_a3b_shaped, tiny
    from nibble.recipe import PrecisionPlan

    config = qwen3_30b_a3b_shaped(num_layers=layers) if kind == "qwen3-30b-a3b" else tiny(vocab_size=64)
    plan = PrecisionPlan.from_config(PlanConfig(), config.num_hidden_layers, device=device)
    with torch.device("meta"):  # weights are made after sharding, each rank only its own shard
        model = MoETransformer(config, plan)
    return model, plan


def _initialise(model, seed: int) -> None:
    """Random weights (std 0.02, norms 1) on each rank's local shard; the values only route tokens."""
    from torch.distributed.tensor import DTensor

    generator = torch.Generator(next(model.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            local = param.to_local() if isinstance(param, DTensor) else param
            if "norm" in name:
                local.fill_(1.0)
            else:
                local.normal_(0.0, 0.02, generator=generator)


def _batch(args, groups: int, vocab: int):
    from nibble.trainer.batch import Batch

    generator = torch.Generator().manual_seed(args.seed)
    rows = groups * args.group_size
    lengths = torch.randint(args.response_tokens // 2, args.response_tokens + 1, (rows,), generator=generator)
    mask = torch.arange(args.response_tokens) < lengths.unsqueeze(1)
    return Batch(
        prompts=torch.randint(1, vocab, (rows, args.prompt_tokens), generator=generator).tolist(),
        responses=[torch.randint(1, vocab, (int(n),), generator=generator).tolist() for n in lengths],
        sampler_logprobs=-torch.rand(rows, args.response_tokens, generator=generator) * mask,
        mask=mask,
        rewards=(torch.rand(rows, generator=generator) < 0.5).to(torch.float32),
        group_index=torch.arange(groups).repeat_interleave(args.group_size),
        staleness=torch.zeros(rows, dtype=torch.long),
        trajectory_ids=[f"t{i}" for i in range(rows)],
        truncated=torch.zeros(rows, dtype=torch.bool),
        temperature=1.0,
    )


def forward_flops(config, lengths: list[int]) -> float:
    """Model FLOPs of one forward over sequences of ``lengths`` tokens (the formula in the module doc)."""
    h, heads, kv, d = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim
    attention = 2 * h * heads * d + 2 * h * kv * d
    per_token = config.vocab_size * h
    for layer in range(config.num_hidden_layers):
        if config.is_moe_layer(layer):
            mlp = config.num_experts * h + config.num_experts_per_tok * 3 * h * config.moe_intermediate_size
            if config.shared_expert_intermediate_size:
                mlp += 3 * h * config.shared_expert_intermediate_size + h
        else:
            mlp = 3 * h * config.intermediate_size
        per_token += attention + mlp
    causal_pairs = sum(n * (n + 1) // 2 for n in lengths)
    return 2.0 * sum(lengths) * per_token + 4.0 * heads * d * causal_pairs * config.num_hidden_layers


def step_flops(config, batch) -> float:
    """Model FLOPs of one ``train_on_batch``: π_old's forward, π_θ's forward and backward (2 forwards)."""
    lengths = [len(p) + len(r) for p, r in zip(batch.prompts, batch.responses, strict=True)]
    return 4.0 * forward_flops(config, lengths)


def spread(values: list[float]) -> dict[str, float]:
    """Median, interquartile range and extremes of ``values`` (at least one)."""
    quartiles = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else [values[0]] * 3
    median, low, high = statistics.median(values), quartiles[0], quartiles[2]
    return {"median": median, "q25": low, "q75": high, "min": min(values), "max": max(values)}


def _measure(model, optimizer, batch, config, shard, args) -> dict:
    """``--warmup`` untimed then ``--steps`` timed steps on ``batch``: per-step seconds and figures."""
    from nibble.trainer.step import train_on_batch

    seconds, tokens, losses = [], [], []
    for step in range(args.warmup + args.steps):
        _synchronize(args.device)
        started = time.perf_counter()
        result = train_on_batch(model, optimizer, batch, config, parallel=shard)
        _synchronize(args.device)
        if step >= args.warmup:
            seconds.append(time.perf_counter() - started)
            tokens.append(result.trained_tokens)
            losses.append(result.loss)
    flops = step_flops(model.config, batch)
    peak = PEAK_FLOPS.get(args.device)
    return {
        "step_seconds": seconds,
        "trained_tokens_per_step": tokens,
        "losses": losses,
        "step": spread(seconds),
        "tokens_per_second": spread([n / t for n, t in zip(tokens, seconds, strict=True)]),
        "model_flops_per_step": flops,
        "mfu_per_gpu": None if peak is None else flops / (statistics.median(seconds) * shard.world_size * peak),
    }


def _profile(model, optimizer, batch, config, shard, args) -> dict | None:
    """One more step under ``torch.profiler``; rank 0's summary by category (other ranks: None)."""
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.profile_summary import summarize
    from nibble.trainer.step import train_on_batch

    cuda = args.device == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    _synchronize(args.device)
    with profile(activities=activities) as recording:
        started = time.perf_counter()
        train_on_batch(model, optimizer, batch, config, parallel=shard)
        _synchronize(args.device)
        wall = time.perf_counter() - started
    return summarize(list(recording.events()), wall, cuda) if shard.rank == 0 else None


def worker(args) -> None:
    """One rank: shard, initialise, measure every configuration ``--repeats`` times; rank 0 writes."""
    from nibble.config import TrainerConfig
    from nibble.recipe import param_groups
    from nibble.trainer import sharded

    torch.set_num_threads(args.threads)
    shard = sharded.init_process_group(args.device)
    model, plan = _model(args.model, args.layers, args.device)
    sharded.shard_model(model)
    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")
    model.to_empty(device=device)
    _initialise(model, args.seed)
    model.train()
    optimizer = torch.optim.AdamW(param_groups(model, plan, 0.0), lr=2e-4)
    groups = {"strong": args.groups}
    if shard.world_size != args.baseline:
        groups["weak"] = args.groups * shard.world_size // args.baseline
    batches = {name: _batch(args, n, model.config.vocab_size) for name, n in groups.items()}
    configs = {
        name: TrainerConfig(groups_per_step=n, updates_per_batch=args.updates_per_batch) for name, n in groups.items()
    }
    repeats = {name: [] for name in groups}
    for _ in range(args.repeats):
        for name in groups:
            repeats[name].append(_measure(model, optimizer, batches[name], configs[name], shard, args))
    profile = _profile(model, optimizer, batches["strong"], configs["strong"], shard, args) if args.profile else None
    peak = torch.cuda.max_memory_allocated() if args.device == "cuda" else 0
    peaks = [torch.zeros(1, dtype=torch.float64, device=device) for _ in range(shard.world_size)]
    torch.distributed.all_gather(peaks, torch.tensor([float(peak)], dtype=torch.float64, device=device))
    if shard.rank == 0:
        figures = {
            "world_size": shard.world_size,
            "groups_per_step": groups,
            "repeats": repeats,
            "profile_seconds": profile,
            "peak_gpu_bytes_per_rank": [int(p.item()) for p in peaks],
            "parameters": sum(p.numel() for p in model.parameters()),
        }
        Path(args.worker_out).write_text(json.dumps(figures) + "\n")
    sharded.close()


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _run(argv: list[str], nproc: int, baseline: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "figures.json"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
        command += ["-m", "benchmarks.sharded_trainer", *argv, "--baseline", str(baseline), "--worker-out", str(out)]
        started = time.monotonic()
        done = subprocess.run(command, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if done.returncode != 0:
            raise SystemExit(f"torchrun with {nproc} processes failed (exit {done.returncode}); see above")
        figures = json.loads(out.read_text())
        figures["wall_seconds_including_start"] = time.monotonic() - started
        return figures


def _check(parser: argparse.ArgumentParser, args) -> list[int]:
    """The process counts of ``--gpus``; any unusable argument ends the script with a message naming it."""
    try:
        counts = [int(n) for n in args.gpus.split(",")]
    except ValueError:
        parser.error(f"--gpus={args.gpus!r}: expected comma-separated process counts such as 1,2")
    if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
        parser.error(f"--gpus={args.gpus!r}: process counts must be distinct and at least 1")
    names = ("layers", "groups", "group_size", "prompt_tokens", "response_tokens", "updates_per_batch", "steps")
    for name in (*names, "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}={getattr(args, name)} must be at least 1")
    if args.warmup < 0 or args.threads < 1:
        parser.error("--warmup must be >= 0 and --threads >= 1")
    if args.response_tokens < 2:
        parser.error("--response-tokens must be at least 2 (lengths are drawn from half of it up to it)")
    for n in counts:
        groups = args.groups * n / counts[0]
        if groups != int(groups) or int(groups) % args.updates_per_batch:
            parser.error(
                f"--groups={args.groups} gives {groups:g} groups per step at {n} processes (weak scaling), "
                f"which must be a whole number divisible by --updates-per-batch={args.updates_per_batch}"
            )
    return counts


def _refuse_missing_gpus(counts: list[int], device: str) -> None:
    if device != "cuda":
        return
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible < max(counts):
        raise SystemExit(
            f"benchmarks/sharded_trainer.py: --gpus asks for {max(counts)} GPUs but this machine has {visible} "
            "visible CUDA device(s); use --gpus with at most that many, or --device cpu to check the script"
        )


def _print_run(n: int, run: dict) -> None:
    """Every measurement of one process count, repeat by repeat, and the spread between repeats."""
    peak = max(run["peak_gpu_bytes_per_rank"]) / 2**30
    for scaling, repeats in run["repeats"].items():
        groups = run["groups_per_step"][scaling]
        print(f"{scaling:6s} {n} process(es), {groups} groups/step, peak {peak:.1f} GiB/rank:")
        for i, r in enumerate(repeats, 1):
            t, step = r["tokens_per_second"], r["step"]
            mfu = "" if r["mfu_per_gpu"] is None else f", MFU {r['mfu_per_gpu']:.1%}/GPU"
            print(
                f"  repeat {i}: {t['median']:,.0f} trained tokens/s (IQR {t['q25']:,.0f}-{t['q75']:,.0f}), "
                f"step median {step['median']:.3f} s (IQR {step['q25']:.3f}-{step['q75']:.3f}, "
                f"min-max {step['min']:.3f}-{step['max']:.3f}){mfu}"
            )
        medians = [r["tokens_per_second"]["median"] for r in repeats]
        between = (max(medians) - min(medians)) / statistics.mean(medians)
        print(f"  spread between repeats: {between:.1%} of the mean of their medians")


def _scaling(runs: dict[str, dict], counts: list[int]) -> dict[str, list[float]]:
    """Tokens/s at each count over the baseline's, per repeat (median against median), printed."""
    first, ratios = counts[0], {}
    base = runs[str(first)]["repeats"]["strong"]  # at the baseline count the weak batch is the strong one
    for scaling in ("strong", "weak"):
        for n in counts[1:]:
            pairs = zip(runs[str(n)]["repeats"][scaling], base, strict=True)
            per_repeat = [o["tokens_per_second"]["median"] / b["tokens_per_second"]["median"] for o, b in pairs]
            ratios[f"{scaling}_{n}_vs_{first}"] = per_repeat
            shown = ", ".join(f"{r:.2f}x" for r in per_repeat)
            efficiency = statistics.mean(per_repeat) * first / n
            print(f"{scaling} scaling {n} vs {first} process(es): {shown} per repeat (efficiency {efficiency:.2f})")
    return ratios


def _report(runs: dict[str, dict], counts: list[int]) -> dict[str, list[float]]:
    """Print every measurement, the scaling ratios and the profiles; return the ratios per repeat."""
    from benchmarks.profile_summary import table

    for n in counts:
        _print_run(n, runs[str(n)])
    ratios = _scaling(runs, counts)
    for n in counts:
        if runs[str(n)]["profile_seconds"] is not None:
            print(f"profile of one strong-scaling step, rank 0 of {n}:\n{table(runs[str(n)]['profile_seconds'])}")
    return ratios


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", default="1,2", help="process counts to compare, the first is the baseline")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--model", choices=("qwen3-30b-a3b", "tiny"), default="qwen3-30b-a3b")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers (the real model has 48)")
    parser.add_argument("--groups", type=int, default=8, help="GRPO groups per step at the baseline count")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--response-tokens", type=int, default=192, help="longest response (lengths uniform 1/2..1)")
    parser.add_argument("--updates-per-batch", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps before each measurement")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per measurement")
    parser.add_argument("--repeats", type=int, default=2, help="times the whole set of measurements is repeated")
    parser.add_argument("--profile", action="store_true", help="record one more step with torch.profiler, summarised")
    parser.add_argument("--threads", type=int, default=4, help="torch CPU threads per process")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out",
        type=Path,
        help="results JSON (default: benchmarks/results/h200x2_sharded_trainer_grouped.json on CUDA, "
        "runs/benchmarks/sharded_trainer_cpu.json with --device cpu, so a script check never replaces GPU figures)",
    )
    parser.add_argument("--baseline", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.worker_out:
        worker(args)
        return
    counts = _check(parser, args)
    _refuse_missing_gpus(counts, args.device)
    if args.out is None:
        gpu = args.device == "cuda"
        args.out = GPU_RESULTS if gpu else Path("runs/benchmarks/sharded_trainer_cpu.json")
    runs = {str(n): _run(argv, n, counts[0]) for n in counts}
    ratios = _report(runs, counts)
    result = {
        "machine": describe(),
        "gpus_visible": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "command": "python -m benchmarks.sharded_trainer " + " ".join(argv),
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "worker_out", "baseline")},
        "peak_flops_per_gpu": PEAK_FLOPS.get(args.device),
        "flop_formula": __doc__.split("MFU: ")[1].split("\n\n")[0],
        "scaling_per_repeat": ratios,
        "runs": runs,
    }
    write_record(args.out, result, default=str)
    losses = [x for run in runs.values() for repeats in run["repeats"].values() for r in repeats for x in r["losses"]]
    if not all(math.isfinite(x) for x in losses):
        raise SystemExit("a loss was not finite (the figures are recorded, but the run is not a valid benchmark)")


if __name__ == "__main__":
    main()
