"""How far a few small AdamW steps move a policy's logprobs under each precision plan.

The H200 stability runs (README "Stability") showed NVFP4 policies whose batches sampled one or more
versions earlier differ from the trainer's by 0.2–0.46 mean |Δlogprob| — as much as the naive variant's
precision mismatch — where BF16's differ by 0.01–0.03. This measures the effect without sampling or
RL: one model, one fixed set of real token sequences (the task's chat-formatted prompts, every token
after the first scored), AdamW steps on the plain log-likelihood of those tokens (the first AdamW step
moves every weight by ``learning_rate`` in the direction of its gradient's sign), and after each step

- ``logprob_abs_diff``: mean |log π_k − log π_0| over the scored tokens, the policy's own movement, in
  its own numerics (the trainer's quantised forward, which the sampler reproduces at staleness 0), and
  ``logprob_mean_change``, the signed mean (the steps raise these tokens' likelihood: movement that is
  signal shows here, movement that is noise only in the absolute value);
- ``weights_changed``: the fraction of the plan's quantised weight elements whose E2M1 code changed and
  of blocks whose E4M3 scale changed (weight-sync's quantise-once form of the published bf16 weights),
  or, for BF16 tensors, of bf16 weights that changed;

beside the plan's precision noise at step 0 (mean |log π_0 − log π_0^BF16|) and, as a control, the
largest difference between two forward passes at step 0 (0: the forward is deterministic). A plan whose movement after
one step is close to its precision noise re-draws its quantisation with every update.

    .venv/bin/python -m benchmarks.update_sensitivity --config configs/smollm2-stability.yaml \
        --out benchmarks/results/update_sensitivity_smollm2.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

from benchmarks.machine import describe
from benchmarks.stability.setting import from_config
from benchmarks.stability.variants import VARIANTS, plan_for
from nibble.model import from_pretrained, load_config
from nibble.model.scoring import score
from nibble.recipe import param_groups
from nibble.recipe.export import published_state, quantize_state


def token_sequences(source, count: int, seed: int) -> list[list[int]]:
    """``count`` chat-formatted prompts of the source's task (token ids), from its training stream."""
    with source.make_task(1) as task:
        stream = task.train_stream(seed)
        return [task.prompt_ids(next(stream)) for _ in range(count)]


def logprobs(model, sequences: list[list[int]]) -> torch.Tensor:
    """Every token after the first of each sequence, scored: float64 ``[tokens]``, padding dropped."""
    scores = score(model, [s[:1] for s in sequences], [s[1:] for s in sequences])
    return scores.logprobs[scores.mask].double()


def changed(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> dict[str, float]:
    """Fractions of quantised weight elements with a new E2M1 code and of blocks with a new E4M3 scale,
    and of bf16 weights with new bits (over the tensors weight-sync sends in each form)."""
    counts = {"codes": [0, 0], "block_scales": [0, 0], "bf16": [0, 0]}
    for name, old in before.items():
        new = after[name]
        if name.endswith("codes"):
            # two E2M1 codes per byte: a changed nibble is a changed element
            diff = old ^ new
            flips = int(((diff & 0x0F) != 0).sum()) + int(((diff >> 4) != 0).sum())
            counts["codes"][0] += flips
            counts["codes"][1] += 2 * old.numel()
        elif name.endswith("block_scales"):
            counts["block_scales"][0] += int((old != new).sum())
            counts["block_scales"][1] += old.numel()
        elif old.dtype == torch.bfloat16 and old.dim() == 2:
            counts["bf16"][0] += int((old != new).sum())
            counts["bf16"][1] += old.numel()
    return {key: (n / total if total else None) for key, (n, total) in counts.items()}


def measure(source, variant: str, sequences, steps: int, learning_rate: float, reference: torch.Tensor | None,
            device: str) -> dict:  # fmt: skip
    """One plan: its precision noise against ``reference`` (BF16's step-0 logprobs) and, after each of
    ``steps`` AdamW steps, the movement of its logprobs and weights from step 0."""
    layers = load_config(source.checkpoint).num_hidden_layers
    plan = plan_for(variant, layers, source.quantize, device)
    model = from_pretrained(source.checkpoint, plan=plan).to(device).train()
    optimizer = torch.optim.AdamW(param_groups(model, plan, 0.0), lr=learning_rate, weight_decay=0.0)
    with torch.no_grad():
        start = logprobs(model, sequences)
        # the measurement is only meaningful if the forward is deterministic: a second pass must agree
        repeat = float((logprobs(model, sequences) - start).abs().max())
    start_weights = quantize_state(published_state(model), plan)
    record = {
        "variant": variant,
        "tokens": start.numel(),
        "precision_noise": None if reference is None else float((start - reference).abs().mean()),
        "repeat_max_abs_diff": repeat,
        "steps": [],
    }
    for step in range(1, steps + 1):
        optimizer.zero_grad(set_to_none=True)
        (-logprobs(model, sequences).mean()).backward()
        optimizer.step()
        with torch.no_grad():
            now = logprobs(model, sequences)
        weights = changed(start_weights, quantize_state(published_state(model), plan))
        moved = {
            "logprob_abs_diff": float((now - start).abs().mean()),
            "logprob_mean_change": float((now - start).mean()),
        }
        record["steps"].append({"step": step} | moved | weights)
    return record, start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True, help="a run config: its model, task and plan scope")
    parser.add_argument("--variants", nargs="+", default=["bf16", "nvfp4_naive", "nvfp4_token", "recipe"],
                        choices=list(VARIANTS))  # fmt: skip
    parser.add_argument("--steps", type=int, default=4, help="AdamW steps (default 4)")
    parser.add_argument("--learning-rate", type=float, default=None, help="default: the config's")
    parser.add_argument("--sequences", type=int, default=8, help="prompts scored (default 8)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.sequences < 1:
        parser.error("--steps and --sequences must be at least 1")
    if args.learning_rate is not None and not (math.isfinite(args.learning_rate) and args.learning_rate > 0):
        parser.error(f"--learning-rate {args.learning_rate}: must be a positive finite number")
    if args.out.exists():
        parser.error(f"--out {args.out} exists; choose a new file (results are never overwritten)")
    try:
        source, setting = from_config(args.config, 1, None, [args.device])
    except ValueError as error:
        parser.error(str(error))
    learning_rate = args.learning_rate or setting.learning_rate
    torch.manual_seed(args.seed)
    started = time.time()
    sequences = token_sequences(source, args.sequences, args.seed)
    variants = ["bf16", *[v for v in args.variants if v != "bf16"]]
    reference, records = None, []
    for variant in variants:
        record, start = measure(source, variant, sequences, args.steps, learning_rate, reference, args.device)
        reference = start if variant == "bf16" else reference
        records.append(record)
        moves = ", ".join(f"{s['logprob_abs_diff']:.4f} ({s['logprob_mean_change']:+.4f})" for s in record["steps"])
        noise = "" if record["precision_noise"] is None else f"precision noise {record['precision_noise']:.4f}, "
        first = record["steps"][0]
        flips = first["codes"] if first["codes"] is not None else first["bf16"]
        print(f"{variant:12s} {noise}repeat {record['repeat_max_abs_diff']:.1e}; |Δlogprob| (signed mean) after "
              f"steps 1..{args.steps}: {moves}; weights changed after step 1: {flips:.2e}", flush=True)  # fmt: skip
    result = {
        "benchmark": "update_sensitivity",
        "command": " ".join(["python -m benchmarks.update_sensitivity", *(argv if argv is not None else sys.argv[1:])]),
        "machine": describe(),
        "config": str(args.config),
        "checkpoint": str(source.checkpoint),
        "learning_rate": learning_rate,
        "sequences": args.sequences,
        "seed": args.seed,
        "device": args.device,
        "wall_seconds": time.time() - started,
        "variants": records,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"recorded {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
