"""Where prompts and rewards come from."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from nibble.config.base import Section


class TaskConfig(Section):
    """Which task prompts and rewards come from (``nibble.tasks.get_task(name, **options)``)."""

    name: str = "addition"
    options: dict[str, Any] = Field(default_factory=lambda: {"digits": 2, "eval_size": 512, "holdout_fraction": 0.1})
