"""Trainer throughput, FSDP2-sharded over N GPUs against one GPU, on the Qwen3-30B-A3B-shaped model.

For each N in ``--gpus`` this starts ``torchrun --nproc-per-node N`` on this file's worker, which builds
the model with Qwen3-30B-A3B's layer dimensions (hidden 2048, 128 experts top-8, expert width 768,
vocabulary 151936) and ``--layers`` decoder layers, the run's default precision plan (NVFP4 experts,
per-token activation scales, 4/6, dequantised backward, last 15% of layers BF16; compute in bf16 on
CUDA), and trains it with the trainer's own ``train_on_batch`` on a synthetic batch of whole GRPO groups
(random tokens, rewards and sampler logprobs). Every figure comes from this one run, side by side:
trained (valid response) tokens per second over the timed steps, after warm-up, and each rank's peak
GPU memory. Run on the multi-GPU machine:

    python -m benchmarks.sharded_trainer --gpus 1,2 --out benchmarks/results/h200x2_sharded_trainer.json

``--device cpu --model tiny`` runs the same code on CPU processes (gloo), to check the script.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.machine import describe


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


def _batch(args, vocab: int):
    from nibble.trainer.batch import Batch

    generator = torch.Generator().manual_seed(args.seed)
    rows = args.groups * args.group_size
    lengths = torch.randint(args.response_tokens // 2, args.response_tokens + 1, (rows,), generator=generator)
    mask = torch.arange(args.response_tokens) < lengths.unsqueeze(1)
    return Batch(
        prompts=torch.randint(1, vocab, (rows, args.prompt_tokens), generator=generator).tolist(),
        responses=[torch.randint(1, vocab, (int(n),), generator=generator).tolist() for n in lengths],
        sampler_logprobs=-torch.rand(rows, args.response_tokens, generator=generator) * mask,
        mask=mask,
        rewards=(torch.rand(rows, generator=generator) < 0.5).to(torch.float32),
        group_index=torch.arange(args.groups).repeat_interleave(args.group_size),
        staleness=torch.zeros(rows, dtype=torch.long),
        trajectory_ids=[f"t{i}" for i in range(rows)],
        truncated=torch.zeros(rows, dtype=torch.bool),
        temperature=1.0,
    )


def worker(args) -> None:
    """One rank: shard, initialise, train ``--warmup`` + ``--steps`` batches, rank 0 writes the figures."""
    from nibble.config import TrainerConfig
    from nibble.recipe import param_groups
    from nibble.trainer import sharded
    from nibble.trainer.step import train_on_batch

    torch.set_num_threads(args.threads)
    shard = sharded.init_process_group(args.device)
    model, plan = _model(args.model, args.layers, args.device)
    sharded.shard_model(model)
    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")
    model.to_empty(device=device)
    _initialise(model, args.seed)
    model.train()
    optimizer = torch.optim.AdamW(param_groups(model, plan, 0.0), lr=2e-4)
    config = TrainerConfig(groups_per_step=args.groups, updates_per_batch=args.updates_per_batch)
    batch = _batch(args, model.config.vocab_size)
    seconds, tokens, losses = [], [], []
    for step in range(args.warmup + args.steps):
        _synchronize(args.device)
        started = time.perf_counter()
        result = train_on_batch(model, optimizer, batch, config, shard=shard)
        _synchronize(args.device)
        if step >= args.warmup:
            seconds.append(time.perf_counter() - started)
            tokens.append(result.trained_tokens)
            losses.append(result.loss)
    peak = torch.cuda.max_memory_allocated() if args.device == "cuda" else 0
    peaks = [torch.zeros(1, dtype=torch.float64, device=device) for _ in range(shard.world_size)]
    torch.distributed.all_gather(peaks, torch.tensor([float(peak)], dtype=torch.float64, device=device))
    if shard.rank == 0:
        figures = {
            "world_size": shard.world_size,
            "step_seconds": seconds,
            "trained_tokens_per_step": tokens,
            "tokens_per_second": sum(tokens) / sum(seconds),
            "losses": losses,
            "peak_gpu_bytes_per_rank": [int(p.item()) for p in peaks],
            "parameters": sum(p.numel() for p in model.parameters()),
        }
        Path(args.worker_out).write_text(json.dumps(figures) + "\n")
    sharded.close()


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _run(argv: list[str], nproc: int, groups: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "figures.json"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
        command += ["-m", "benchmarks.sharded_trainer", *argv, "--groups", str(groups), "--worker-out", str(out)]
        started = time.monotonic()
        done = subprocess.run(command, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if done.returncode != 0:
            raise SystemExit(f"torchrun with {nproc} processes failed (exit {done.returncode}); see above")
        figures = json.loads(out.read_text())
        figures["groups_per_step"] = groups
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
    for name in ("layers", "groups", "group_size", "prompt_tokens", "response_tokens", "updates_per_batch", "steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}={getattr(args, name)} must be at least 1")
    if args.warmup < 0 or args.threads < 1:
        parser.error("--warmup must be >= 0 and --threads >= 1")
    if args.response_tokens < 2:
        parser.error("--response-tokens must be at least 2 (lengths are drawn from half of it up to it)")
    if args.groups % args.updates_per_batch:
        parser.error(f"--groups={args.groups} is not divisible by --updates-per-batch={args.updates_per_batch}")
    return counts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", default="1,2", help="process counts to compare, the first is the baseline")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--model", choices=("qwen3-30b-a3b", "tiny"), default="qwen3-30b-a3b")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers (the real model has 48)")
    parser.add_argument("--groups", type=int, default=8, help="GRPO groups per consumed batch")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--response-tokens", type=int, default=192, help="longest response (lengths uniform 1/2..1)")
    parser.add_argument("--updates-per-batch", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=4, help="torch CPU threads per process")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out",
        type=Path,
        help="results JSON (default: benchmarks/results/h200x2_sharded_trainer.json on CUDA, "
        "runs/benchmarks/sharded_trainer_cpu.json with --device cpu, so a script check never replaces GPU figures)",
    )
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.worker_out:
        worker(args)
        return
    counts = _check(parser, args)
    if args.device == "cuda" and (not torch.cuda.is_available() or torch.cuda.device_count() < max(counts)):
        raise SystemExit(f"benchmarks/sharded_trainer.py needs {max(counts)} CUDA GPUs (or --device cpu)")
    if args.out is None:
        gpu = args.device == "cuda"
        args.out = Path(
            "benchmarks/results/h200x2_sharded_trainer.json" if gpu else "runs/benchmarks/sharded_trainer_cpu.json"
        )
    first = counts[0]
    runs = {"strong": {str(n): _run(argv, n, args.groups) for n in counts}}
    runs["weak"] = {str(first): runs["strong"][str(first)]}
    runs["weak"].update({str(n): _run(argv, n, args.groups * n // first) for n in counts if n != first})
    for scaling, by_count in runs.items():
        base = by_count[str(first)]["tokens_per_second"]
        for n in counts:
            run = by_count[str(n)]
            run["speedup_vs_first"] = run["tokens_per_second"] / base
            run["scaling_efficiency"] = run["speedup_vs_first"] * first / n
            peak = max(run["peak_gpu_bytes_per_rank"]) / 2**30
            step = sum(run["step_seconds"]) / len(run["step_seconds"])
            print(
                f"{scaling:6s} {n} process(es), {run['groups_per_step']} groups/step: "
                f"{run['tokens_per_second']:,.0f} trained tokens/s ({run['speedup_vs_first']:.2f}x, "
                f"efficiency {run['scaling_efficiency']:.2f}), step {step:.2f} s, "
                f"peak GPU {peak:.1f} GiB/rank"
            )
    result = {
        "machine": describe(),
        "gpus_visible": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "command": "python -m benchmarks.sharded_trainer " + " ".join(argv),
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "worker_out")},
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {args.out}")
    if not all(math.isfinite(x) for by_count in runs.values() for run in by_count.values() for x in run["losses"]):
        raise SystemExit("a loss was not finite (the figures are recorded, but the run is not a valid benchmark)")


if __name__ == "__main__":
    main()
