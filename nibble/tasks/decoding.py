"""From sampled token ids back to the response text a task's reward reads."""

from __future__ import annotations

from collections.abc import Sequence

from nibble.tasks.base import Task


def decode_response(task: Task, tokens: Sequence[int]) -> str:
    """Response text without the end-of-sequence token that closed it."""
    ids = list(tokens)
    if ids and ids[-1] == task.tokenizer.eos_id:
        ids = ids[:-1]
    return task.tokenizer.decode(ids)
