"""Held-out evaluation: greedy responses to a task's evaluation split, scored by its reward."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from nibble.model.generate import generate
from nibble.model.transformer import MoETransformer
from nibble.tasks.base import Example, Task
from nibble.tasks.decoding import decode_response


class EvaluationStopped(Exception):
    """``should_stop`` said so between two batches of :func:`accuracy`."""


@torch.no_grad()
def accuracy(
    model: MoETransformer,
    task: Task,
    examples: Sequence[Example] | None = None,
    batch: int = 128,
    stop_early: bool = True,
    should_stop: Callable[[], bool] | None = None,
) -> float:
    """Fraction of ``examples`` (default: the task's evaluation split) answered with reward ≥ 1 under
    greedy decoding; a response whose reward fails (``None``) counts as wrong. ``stop_early=False`` for
    an FSDP-sharded model (see :func:`nibble.model.generate.generate`).

    Raises:
        EvaluationStopped: ``should_stop()`` returned True before a batch (a service shutting down).
    """
    examples = list(task.eval_examples() if examples is None else examples)
    if not examples:
        raise ValueError("accuracy: no evaluation examples")
    correct = 0
    for start in range(0, len(examples), batch):
        if should_stop is not None and should_stop():
            raise EvaluationStopped
        chunk = examples[start : start + batch]
        out = generate(
            model,
            [task.prompt_ids(e) for e in chunk],
            max_new_tokens=task.max_response_tokens,
            temperature=0.0,
            stop_tokens=[task.tokenizer.eos_id],
            pad_id=task.tokenizer.pad_id,
            stop_early=stop_early,
        )
        rewards = task.score_many(chunk, [decode_response(task, t) for t in out.tokens])
        correct += sum(1 for r in rewards if r is not None and r >= 1.0)
    return correct / len(examples)
