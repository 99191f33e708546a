"""Turning one prompt's samples and rewards into a wire ``TrajectoryGroup`` (docs/design.md §5)."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from nibble.sampler.engine import Sample
from nibble.wire import pb

_FINISH = {"stop": pb.STOP, "length": pb.LENGTH}


@dataclass(frozen=True)
class GroupOutcome:
    """``group`` is ``None`` when fewer than 2 responses survived (the group is not written);
    ``removed`` counts responses dropped because their reward failed."""

    group: pb.TrajectoryGroup | None
    removed: int


def build_group(
    *,
    example_id: str,
    prompt_tokens: Sequence[int],
    samples: Sequence[Sample],
    rewards: Sequence[float | None],
    trajectory_ids: Sequence[str],
    group_id: str,
    policy_version: int,
    sampler_id: str,
    temperature: float,
    started_at: float,
) -> GroupOutcome:
    """Keep the responses whose reward is a finite number; a group needs at least 2 of them."""
    group = pb.TrajectoryGroup(
        group_id=group_id,
        example_id=example_id,
        prompt_tokens=list(prompt_tokens),
        policy_version=policy_version,
        sampler_id=sampler_id,
        temperature=temperature,
        started_at=started_at,
        finished_at=time.time(),
    )
    removed = 0
    for sample, reward, trajectory_id in zip(samples, rewards, trajectory_ids, strict=True):
        if reward is None or not math.isfinite(reward) or not sample.tokens:
            removed += 1
            continue
        group.responses.add(
            trajectory_id=trajectory_id,
            tokens=sample.tokens,
            logprobs=sample.logprobs,
            reward=float(reward),
            finish_reason=_FINISH[sample.finish_reason],
        )
    return GroupOutcome(group if len(group.responses) >= 2 else None, removed)
