"""``nibble_sampler_demand``: how many samplers the trainer could use now (the autoscaling signal)."""

from __future__ import annotations

import math


def sampler_demand(
    num_samplers: int,
    idle_seconds: float,
    step_seconds: float,
    queue_depth: int,
    groups_per_step: int,
    max_staleness: int,
) -> int:
    """Samplers that would keep the trainer busy without over-producing.

    - The trainer waited ``idle_seconds`` of a ``step_seconds`` step: samplers supplied only the busy
      share of what it consumes, so scale up by ``step / busy`` (at most 4× per step).
    - Otherwise, a backlog of more steps than ``max_staleness + 1`` in the queue ages into staleness:
      scale down in proportion.
    Never below 1.
    """
    if step_seconds > 0 and idle_seconds > 0:
        busy = max(step_seconds - idle_seconds, step_seconds / 4)
        return max(1, math.ceil(num_samplers * step_seconds / busy))
    backlog_steps = queue_depth / groups_per_step
    limit = max_staleness + 1
    if backlog_steps > limit:
        return max(1, math.floor(num_samplers * limit / backlog_steps))
    return num_samplers
