"""How far a few small AdamW steps move a policy's logprobs under each precision plan.

In the H200 stability runs (README "Stability") NVFP4 batches sampled one or more versions earlier
differed from the trainer's logprobs by about as much as the naive variant's precision mismatch, where
BF16's differed by a few hundredths. This measures the effect without RL: one model, one fixed set of
responses (sampled once by the BF16 model from the task's prompts, temperature 1, seeded), AdamW steps
(weight decay 0) that raise those responses' log-likelihood, and after each step

- ``logprob_abs_diff``: mean |log π_k − log π_0| over the response tokens, the policy's own movement in
  its own numerics (the trainer's forward, which the sampler reproduces at staleness 0), with its
  median and 90th percentile, and ``logprob_mean_change``, the signed mean (the update's intended
  direction is up: movement that follows the update shows here, movement that does not only in |·|);
- ``weights_changed``: of weight-sync's form of the published bf16 weights, the fraction of E2M1 values
  (a code's sign flip at zero is no change) and of E4M3 block scales that changed, of quantised tensors
  whose global scale changed, and of the remaining bf16 tensors' elements that changed;

beside the plan's precision noise at step 0 (mean |log π_0 − log π_0^BF16|) and, as a control, the
largest difference between two forward passes at step 0 (0: the forward is deterministic). ``--update``
restricts the steps to the plan's quantised weights or to the parameters that stay bf16, to ablate where
the movement comes from (BF16's own run, the yardstick, always steps everything).

    .venv/bin/python -m benchmarks.update_sensitivity --config configs/smollm2-stability.yaml \
        --out benchmarks/results/update_sensitivity_smollm2.json
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

from benchmarks.machine import describe, write_record
from benchmarks.options import AddUp, positive
from benchmarks.stability.results import check_writable
from benchmarks.stability.setting import Setting, Source, from_config
from benchmarks.stability.variants import VARIANTS, plan_for
from nibble.model import from_pretrained, load_config
from nibble.model.generate import generate
from nibble.model.scoring import score
from nibble.recipe import param_groups
from nibble.recipe.export import published_state, quantize_state


def samples(source, count: int, seed: int, max_new_tokens: int, device: str) -> tuple[list, list]:
    """``count`` of the task's prompts (token ids, from its training stream) and one response to each,
    sampled by the BF16 model (temperature 1, ``seed``), eos included when it ended the response."""
    layers = load_config(source.checkpoint).num_hidden_layers
    model = from_pretrained(source.checkpoint, plan=plan_for("bf16", layers, source.quantize, device)).to(device)
    with source.make_task(1) as task:
        stream = task.train_stream(seed)
        prompts = [task.prompt_ids(next(stream)) for _ in range(count)]
        generator = torch.Generator(device=device).manual_seed(seed)
        with torch.no_grad():
            out = generate(model.eval(), prompts, max_new_tokens=max_new_tokens, stop_tokens=[task.tokenizer.eos_id],
                           pad_id=task.tokenizer.pad_id, generator=generator)  # fmt: skip
    return prompts, out.tokens


def logprobs(model, prompts: list[list[int]], responses: list[list[int]]) -> torch.Tensor:
    """The response tokens' logprobs under ``model``: float64 ``[tokens]``, padding dropped."""
    scores = score(model, prompts, responses)
    return scores.logprobs[scores.mask].double()


def changed(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> dict[str, float | None]:
    """Fractions, between two weight-sync forms: E2M1 codes and E4M3 block scales that changed, quantised
    tensors whose global scale changed, and elements of the bf16 tensors that changed (``None`` where a
    form holds no such tensor)."""
    counts = {"codes": [0, 0], "block_scales": [0, 0], "global_scale": [0, 0], "bf16": [0, 0]}
    for name, old in before.items():
        new = after[name]
        if name.endswith("codes"):
            counts["codes"][0] += int((_values(old) != _values(new)).sum())
            counts["codes"][1] += 2 * old.numel()
        elif name.endswith("block_scales"):
            counts["block_scales"][0] += int((old != new).sum())
            counts["block_scales"][1] += old.numel()
        elif name.endswith("global_scale"):
            counts["global_scale"][0] += int(not torch.equal(old, new))
            counts["global_scale"][1] += 1
        elif old.dtype == torch.bfloat16:
            counts["bf16"][0] += int((old != new).sum())
            counts["bf16"][1] += old.numel()
    return {key: (n / total if total else None) for key, (n, total) in counts.items()}


def _values(codes: torch.Tensor) -> torch.Tensor:
    """Two E2M1 codes per byte, as ``[2 × bytes]`` int16 standing for their values: −0 (``0b1000``) is +0, so a
    tiny weight that changes sign but stays zero is no change."""
    nibbles = torch.stack((codes & 0x0F, codes >> 4)).to(torch.int16)
    return torch.where(nibbles == 0b1000, 0, nibbles)


def measure(source, variant: str, data: tuple[list, list], steps: int, learning_rate: float,
            reference: torch.Tensor | None, device: str, update: str = "all") -> tuple[dict, torch.Tensor]:  # fmt: skip
    """One plan: its precision noise against ``reference`` (BF16's step-0 logprobs) and, after each of
    ``steps`` AdamW steps of the parameters ``update`` names (:data:`UPDATES`), the movement of its
    logprobs and weights from step 0; also its step-0 logprobs (float64 ``[tokens]``)."""
    layers = load_config(source.checkpoint).num_hidden_layers
    plan = plan_for(variant, layers, source.quantize, device)
    model = from_pretrained(source.checkpoint, plan=plan).to(device).train()
    for name, param in model.named_parameters():
        # a frozen parameter gets no gradient, so AdamW leaves it exactly as it was
        param.requires_grad_(update == "all" or (plan.format_of(name) != "bf16") == (update == "quantised"))
    optimizer = torch.optim.AdamW(param_groups(model, plan, 0.0), lr=learning_rate, weight_decay=0.0)
    with torch.no_grad():
        start = logprobs(model, *data)
        # the measurement is only meaningful if the forward is deterministic: a second pass must agree
        repeat = float((logprobs(model, *data) - start).abs().max())
    start_weights = quantize_state(published_state(model), plan)
    record = {
        "variant": variant,
        "update": update,
        "tokens": start.numel(),
        "precision_noise": None if reference is None else float((start - reference).abs().mean()),
        "repeat_max_abs_diff": repeat,
        "steps": [],
    }
    for step in range(1, steps + 1):
        optimizer.zero_grad(set_to_none=True)
        (-logprobs(model, *data).mean()).backward()
        optimizer.step()
        with torch.no_grad():
            moved = logprobs(model, *data) - start
        weights = changed(start_weights, quantize_state(published_state(model), plan))
        record["steps"].append({"step": step} | _movement(moved) | weights)
    return record, start


# Which parameters the steps may change: all; only the plan's quantised weights (their E2M1 codes move);
# only the others (attention, norms, embeddings, BF16 layers: the activations reaching quantised layers move).
UPDATES = ("all", "quantised", "bf16")


def _movement(moved: torch.Tensor) -> dict[str, float]:
    size = moved.abs()
    return {
        "logprob_abs_diff": float(size.mean()),
        "logprob_abs_diff_median": float(size.median()),
        "logprob_abs_diff_p90": float(size.quantile(0.9)),
        "logprob_mean_change": float(moved.mean()),
    }


def _arguments(argv: list[str] | None) -> tuple[argparse.Namespace, Source, Setting]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True, help="a run config: its model, task and plan scope")
    parser.add_argument("--variants", action=AddUp, default=["nvfp4_naive", "nvfp4_token", "recipe"],
                        choices=list(VARIANTS), help="plans measured after bf16, which always runs first")  # fmt: skip
    parser.add_argument("--steps", type=positive, default=3, help="AdamW steps (default 3)")
    parser.add_argument("--learning-rate", type=float, default=None, help="default: the config's")
    parser.add_argument("--sequences", type=positive, default=8, help="prompts, one response each (default 8)")
    parser.add_argument("--max-new-tokens", type=positive, default=96, help="response budget (default 96)")
    parser.add_argument(
        "--update", choices=UPDATES, default="all", help="parameters the steps may change (default all): an ablation"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.learning_rate is not None and not (math.isfinite(args.learning_rate) and args.learning_rate > 0):
        parser.error(f"--learning-rate {args.learning_rate}: must be a positive finite number")
    try:
        if args.out.exists():
            parser.error(f"--out {args.out} exists; choose a new file (results are never overwritten)")
    except OSError as exc:  # a name too long for the file system, say
        parser.error(f"--out {args.out}: not a usable path ({exc.strerror or exc})")
    try:
        source, setting = from_config(args.config, steps=1, eval_every=None, devices=[args.device])
    except (ValueError, OSError) as error:
        parser.error(f"--config {args.config}: {error}" if isinstance(error, OSError) else str(error))
    try:
        source.check_devices()
    except ValueError as error:
        parser.error(f"--device {args.device}: {str(error).split(': ', 1)[1]}")
    try:
        if not (source.checkpoint / "config.json").is_file():
            parser.error(
                f"{args.config}: model.checkpoint {source.checkpoint} holds no model (no config.json); "
                "`nibble run` with this config trains its warm start there first"
            )
        load_config(source.checkpoint)
        if not any(source.checkpoint.glob("*.safetensors")):
            parser.error(f"{args.config}: model.checkpoint {source.checkpoint} holds no weights (*.safetensors)")
        source.check_model()
    except (ValueError, OSError) as error:
        parser.error(f"{args.config}: model.checkpoint {source.checkpoint}: {error}")
    try:  # last, so that a refused command leaves no --out folder behind
        check_writable(args.out)
    except ValueError as error:
        parser.error(str(error))
    return args, source, setting


def main(argv: list[str] | None = None) -> int:
    args, source, setting = _arguments(argv)
    learning_rate = args.learning_rate or setting.learning_rate
    started = time.time()
    data = samples(source, args.sequences, args.seed, args.max_new_tokens, args.device)
    reference, records = None, []
    for variant in dict.fromkeys(["bf16", *args.variants]):
        update = "all" if variant == "bf16" else args.update  # BF16's own movement stays the yardstick
        record, start = measure(source, variant, data, args.steps, learning_rate, reference, args.device, update)
        reference = start if variant == "bf16" else reference
        records.append(record)
        print(_summary_line(record), flush=True)
    result = {
        "benchmark": "update_sensitivity",
        "command": " ".join(["python -m benchmarks.update_sensitivity", *(argv if argv is not None else sys.argv[1:])]),
        "machine": describe(),
        "config": str(args.config),
        "checkpoint": str(source.checkpoint),
        "learning_rate": learning_rate,
        "update": args.update,
        "sequences": args.sequences,
        "response_tokens": [len(r) for r in data[1]],
        "seed": args.seed,
        "device": args.device,
        "wall_seconds": time.time() - started,
        "variants": records,
    }
    write_record(args.out, result, indent=1)
    return 0


def _summary_line(record: dict) -> str:
    noise = "" if record["precision_noise"] is None else f"precision noise {record['precision_noise']:.4f}, "
    moves = ", ".join(f"{s['logprob_abs_diff']:.4f} ({s['logprob_mean_change']:+.4f})" for s in record["steps"])
    first = record["steps"][0]
    flips = f"codes {first['codes']:.2e}" if first["codes"] is not None else f"bf16 {first['bf16']:.2e}"
    return (
        f"{record['variant']:12s} {noise}repeat {record['repeat_max_abs_diff']:.1e}; |Δlogprob| (signed mean) "
        f"after steps 1..{len(record['steps'])}: {moves}; changed after step 1: {flips}"
    )


if __name__ == "__main__":
    sys.exit(main())
