"""Train/rollout mismatch per precision plan: sample with the sampler's form, score with the trainer's.

For each plan, the sampler (packed weights) samples responses and records ``μ``; the trainer scores
the same tokens either with the same quantised forward (the bit-exact contract: ``δ`` should be 0
up to BLAS ordering) or in plain BF16 (what a trainer without the recipe's quantised forward sees).
``δ = π_trainer − μ``; metrics follow docs/design.md §4: ``logprob_abs_diff = mean|δ|`` and the k3
estimate ``mismatch_kl = mean(exp(δ) − δ − 1)``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from nibble.model import MoETransformer, from_pretrained, load_config
from nibble.model.generate import generate
from nibble.model.scoring import score
from nibble.recipe import PrecisionPlan
from nibble.tasks import Task, get_task
from nibble.warmstart.sft import SFT_RECORD


@dataclass(frozen=True)
class MismatchRow:
    """One plan under one trainer arrangement; means over all sampled response tokens."""

    plan: str
    trainer: str  # "same_quantized_forward" | "plain_bf16"
    logprob_abs_diff: float
    mismatch_kl: float
    tokens: int


def plan_variants(num_layers: int) -> dict[str, PrecisionPlan]:
    """BF16, MXFP8, NVFP4 and NVFP4+4/6, each quantised one with/without last-15% and shared-expert BF16."""
    variants = {"bf16": PrecisionPlan(num_layers=num_layers, format="bf16")}
    for name, fmt, four_over_six in (("mxfp8", "mxfp8", None), ("nvfp4", "nvfp4", None), ("nvfp4+4/6", "nvfp4", "mse")):
        for tail in (0.15, 0.0):
            for shared in (True, False):
                label = f"{name} tail15={'on' if tail else 'off'} shared_bf16={'on' if shared else 'off'}"
                variants[label] = PrecisionPlan(
                    num_layers=num_layers,
                    format=fmt,
                    four_over_six=four_over_six,
                    bf16_last_fraction=tail,
                    bf16_shared_experts=shared,
                )
    return variants


def task_of(checkpoint: Path) -> Task:
    """The task recorded by ``nibble sft`` beside the checkpoint.

    Raises:
        ValueError: naming the file when ``nibble_sft.json`` is missing or malformed.
    """
    record = Path(checkpoint) / SFT_RECORD
    if not record.is_file():
        raise ValueError(f"{record}: missing (the checkpoint must come from `nibble sft`)")
    try:
        spec = json.loads(record.read_text())["task"]
        return get_task(spec["name"], **spec.get("options", {}))
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{record}: malformed task record ({exc})") from exc


def measure(
    checkpoint: Path,
    *,
    prompts: int = 128,
    temperature: float = 1.0,
    seed: int = 0,
    progress: Callable[[int, int, str], None] | None = None,
) -> list[MismatchRow]:
    """Rows for every plan of :func:`plan_variants` and both trainer arrangements; ``progress(done, total,
    plan)`` before the first plan and after each (sampling and both scorings)."""
    checkpoint = Path(checkpoint)
    config = load_config(checkpoint)
    with task_of(checkpoint) as task:
        if task.tokenizer.vocab_size != config.vocab_size:
            raise ValueError(
                f"{checkpoint}: the recorded task's tokenizer has {task.tokenizer.vocab_size} tokens, the model "
                f"{config.vocab_size} (the task's data or tokenizer changed since `nibble sft`)"
            )
        examples = task.train_examples(prompts, seed=seed)
        prompt_ids = [task.prompt_ids(e) for e in examples]
        stops, pad = [task.tokenizer.eos_id], task.tokenizer.pad_id
        bf16_trainer = from_pretrained(checkpoint).eval()
        rows = []
        variants = plan_variants(config.num_hidden_layers)
        if progress:
            progress(0, len(variants), "")
        for done, (label, plan) in enumerate(variants.items(), start=1):
            trainer = from_pretrained(checkpoint, plan=plan).eval()
            sampler = copy.deepcopy(trainer).pack()
            out = generate(
                sampler,
                prompt_ids,
                max_new_tokens=task.max_response_tokens,
                temperature=temperature,
                stop_tokens=stops,
                pad_id=pad,
                generator=torch.Generator().manual_seed(seed),
            )
            mu = torch.cat([torch.tensor(lp) for lp in out.logprobs])
            for arrangement, scorer in (("same_quantized_forward", trainer), ("plain_bf16", bf16_trainer)):
                rows.append(_row(label, arrangement, scorer, prompt_ids, out.tokens, mu, temperature, pad))
            if progress:
                progress(done, len(variants), label)
    return rows


@torch.no_grad()
def _row(label, arrangement, scorer: MoETransformer, prompts, responses, mu, temperature, pad) -> MismatchRow:
    scores = score(scorer, prompts, responses, temperature=temperature, pad_id=pad)
    delta = scores.logprobs[scores.mask].double() - mu.double()
    return MismatchRow(
        plan=label,
        trainer=arrangement,
        logprob_abs_diff=float(delta.abs().mean()),
        mismatch_kl=float((delta.exp() - delta - 1).mean()),
        tokens=int(delta.numel()),
    )


def as_json(rows: list[MismatchRow]) -> list[dict]:
    return [asdict(r) for r in rows]
