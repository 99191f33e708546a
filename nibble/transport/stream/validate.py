"""What makes a trajectory-group stream entry unusable (docs/design.md §5): such an entry is dead-lettered whole.

A reason reads ``"<code>: <detail>"``; the code (one of :data:`nibble.monitoring.reasons.DEAD_LETTER_REASONS`)
is the bounded label that ``nibble_dead_lettered_total`` counts by, the detail goes to the dead-letter
stream for a human.
A −inf or NaN *logprob* is not a reason: the loss masks such tokens and counts them.
"""

from __future__ import annotations

import math

from nibble.monitoring.reasons import (
    BAD_TEMPERATURE,
    DUPLICATE_TRAJECTORY_ID,
    EMPTY_PROMPT,
    EMPTY_RESPONSE,
    LENGTH_MISMATCH,
    MISSING_ID,
    NEGATIVE_TOKEN,
    NON_FINITE_REWARD,
    TOO_FEW_RESPONSES,
)
from nibble.wire import pb


def reason_code(reason: str) -> str:
    """The code of a reason (``"length_mismatch: response 2 ..."`` → ``"length_mismatch"``)."""
    return reason.split(":", 1)[0]


def validate_group(group: pb.TrajectoryGroup) -> str | None:
    """Why ``group`` cannot be trained on (``"<code>: <detail>"``), or ``None`` when it is usable."""
    return _check_group_fields(group) or _check_responses(group)


def _check_group_fields(group: pb.TrajectoryGroup) -> str | None:
    if len(group.responses) < 2:
        return f"{TOO_FEW_RESPONSES}: {len(group.responses)} response(s), a group needs at least 2"
    for field in ("group_id", "sampler_id"):
        if not getattr(group, field):
            return f"{MISSING_ID}: {field} is empty"
    if not group.prompt_tokens:
        return f"{EMPTY_PROMPT}: group {group.group_id} has no prompt tokens"
    if min(group.prompt_tokens) < 0:
        return f"{NEGATIVE_TOKEN}: group {group.group_id} prompt holds token {min(group.prompt_tokens)}"
    if not (math.isfinite(group.temperature) and group.temperature > 0):
        return f"{BAD_TEMPERATURE}: group {group.group_id} temperature {group.temperature} (must be finite, > 0)"
    return None


def _check_responses(group: pb.TrajectoryGroup) -> str | None:
    seen: set[str] = set()
    for i, response in enumerate(group.responses):
        where = f"group {group.group_id} response {i}"
        if not response.trajectory_id:
            return f"{MISSING_ID}: {where} has no trajectory_id"
        if response.trajectory_id in seen:
            return f"{DUPLICATE_TRAJECTORY_ID}: {where} repeats {response.trajectory_id}"
        seen.add(response.trajectory_id)
        if not response.tokens:
            return f"{EMPTY_RESPONSE}: {where} ({response.trajectory_id}) has no tokens"
        if len(response.tokens) != len(response.logprobs):
            return (
                f"{LENGTH_MISMATCH}: {where} ({response.trajectory_id}) has {len(response.tokens)} tokens "
                f"but {len(response.logprobs)} logprobs"
            )
        if min(response.tokens) < 0:
            return f"{NEGATIVE_TOKEN}: {where} ({response.trajectory_id}) holds token {min(response.tokens)}"
        if not math.isfinite(response.reward):
            return f"{NON_FINITE_REWARD}: {where} ({response.trajectory_id}) reward {response.reward}"
    return None
