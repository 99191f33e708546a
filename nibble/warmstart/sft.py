"""Supervised warm start: teacher-forced training on a task's reference answers.

RL on language models starts from a supervised policy; this trains the tiny default model until its
held-out accuracy reaches a target (or a step budget), so RL starts with room to improve.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from nibble.model import MoETransformer, tiny
from nibble.model.scoring import score
from nibble.tasks import Task
from nibble.tasks.evaluation import accuracy

SFT_RECORD = "nibble_sft.json"


@dataclass(frozen=True)
class SFTResult:
    """What a warm start did: steps taken, held-out accuracy at each evaluation, the final loss."""

    steps: int
    eval_accuracy: float
    history: list[tuple[int, float]]
    final_loss: float
    parameters: int


def train_sft(
    task: Task,
    *,
    steps: int = 1000,
    batch_size: int = 64,
    learning_rate: float = 3e-3,
    target_accuracy: float | None = 0.3,
    eval_every: int = 10,
    seed: int = 0,
    progress: Callable[[int, float, float | None], None] | None = None,
) -> tuple[MoETransformer, SFTResult]:
    """Train a fresh tiny model (all-BF16 plan) with teacher forcing on ``task``'s answers.

    Stops after ``steps`` optimiser steps, or at the first evaluation (every ``eval_every`` steps)
    whose held-out accuracy reaches ``target_accuracy``. The loss is the mean negative logprob of
    the answer tokens (including the end-of-sequence token).

    Raises:
        ValueError: non-positive ``steps``, ``batch_size``, ``eval_every`` or ``learning_rate``, or a
            ``target_accuracy`` outside (0, 1].
    """
    _check(steps, batch_size, learning_rate, target_accuracy, eval_every)
    torch.manual_seed(seed)
    model = MoETransformer(tiny(task.tokenizer.vocab_size))
    check_fits_context(task, model.config.max_position_embeddings)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 20))
    stream = task.train_stream(seed)
    history: list[tuple[int, float]] = []
    loss_value = float("nan")
    step = 0
    for step in range(1, steps + 1):
        batch = [next(stream) for _ in range(batch_size)]
        scores = score(
            model,
            [task.prompt_ids(e) for e in batch],
            [task.answer_ids(e) for e in batch],
            pad_id=task.tokenizer.pad_id,
        )
        loss = -(scores.logprobs * scores.mask).sum() / scores.mask.sum()
        if not torch.isfinite(loss):
            raise ValueError(f"training diverged at step {step} (non-finite loss); lower learning_rate={learning_rate}")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        loss_value = loss.item()
        evaluated = None
        if step % eval_every == 0 or step == steps:
            model.eval()
            evaluated = accuracy(model, task)
            model.train()
            history.append((step, evaluated))
        if progress:
            progress(step, loss_value, evaluated)
        if evaluated is not None and target_accuracy is not None and evaluated >= target_accuracy:
            break
    final = history[-1][1] if history else accuracy(model, task)
    return model, SFTResult(step, final, history, loss_value, model.num_parameters())


def save_warm_start(model: MoETransformer, result: SFTResult, task_spec: dict, out: Path) -> None:
    """Write the HF-format checkpoint and ``nibble_sft.json`` (task, options, accuracy) to ``out``."""
    model.save_pretrained(out)
    record = {"task": task_spec, **asdict(result)}
    (Path(out) / SFT_RECORD).write_text(json.dumps(record, indent=2) + "\n")


def check_fits_context(task: Task, context: int, sample: int = 1000) -> None:
    """Raise ``ValueError`` when the task's prompts plus ``max_response_tokens`` exceed ``context``
    (checked on the evaluation split and the first ``sample`` training examples)."""
    examples = [*task.eval_examples(), *task.train_examples(sample, seed=0)]
    longest = max(examples, key=lambda e: len(task.prompt_ids(e)))
    need = len(task.prompt_ids(longest)) + task.max_response_tokens
    if need > context:
        raise ValueError(
            f"task {task.name!r}: the longest prompt ({len(task.prompt_ids(longest))} tokens, example "
            f"{longest.id!r}) plus max_response_tokens={task.max_response_tokens} needs {need} positions; "
            f"the model's context is {context} (lower the task option max_response_tokens or shorten prompts)"
        )


def _check(steps, batch_size, learning_rate, target_accuracy, eval_every) -> None:
    for name, value in (("steps", steps), ("batch_size", batch_size), ("eval_every", eval_every)):
        if value < 1:
            raise ValueError(f"{name}={value} must be >= 1")
    if not math.isfinite(learning_rate) or learning_rate <= 0:
        raise ValueError(f"learning_rate={learning_rate} must be > 0")
    if target_accuracy is not None and not 0 < target_accuracy <= 1:
        raise ValueError(f"target_accuracy={target_accuracy} must lie in (0, 1]")
