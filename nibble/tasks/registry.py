"""Tasks by name, for configuration files: ``get_task("addition", digits=4)``, ``get_task("reasoning_gym", ...)``."""

from __future__ import annotations

import inspect

from nibble.tasks.addition import AdditionTask, HeavyTailAdditionTask
from nibble.tasks.base import Task
from nibble.tasks.jsonl import JsonlTask
from nibble.tasks.reasoning import ReasoningGymTask

TASKS: dict[str, type[Task]] = {
    "addition": AdditionTask,
    "addition_heavy_tail": HeavyTailAdditionTask,
    "jsonl": JsonlTask,
    "reasoning_gym": ReasoningGymTask,
}


def get_task(name: str, **options: object) -> Task:
    """The task registered as ``name``, built with ``options`` (its constructor's arguments).

    Raises:
        ValueError: ``name`` is unknown (the message lists the known names), an option is not an
            argument of that task (the message lists them), or the task rejects an option's value.
    """
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}")
    cls = TASKS[name]
    parameters = inspect.signature(cls.__init__).parameters
    accepted = [p for p in parameters if p != "self"]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(
            f"task {name!r} has no option {', '.join(map(repr, unknown))}; its options: {', '.join(accepted)}"
        )
    try:
        return cls(**options)
    except TypeError as exc:  # a missing required option, or a value of the wrong type
        raise ValueError(f"task {name!r}: bad options {options!r} ({exc}); its options: {', '.join(accepted)}") from exc
