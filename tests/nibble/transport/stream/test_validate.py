"""validate_group: each defect gives its reason code; a whole, well-formed group (even with −inf logprobs) passes."""

import math

import pytest

from nibble.monitoring.reasons import DEAD_LETTER_REASONS
from nibble.transport.stream.validate import reason_code, validate_group
from tests.helpers import trajectory_group


def break_group(defect: str):
    group = trajectory_group("g7")
    if defect == "too_few_responses":
        del group.responses[1:]
    elif defect == "missing_id":
        group.responses[2].trajectory_id = ""
    elif defect == "duplicate_trajectory_id":
        group.responses[3].trajectory_id = group.responses[0].trajectory_id
    elif defect == "empty_prompt":
        del group.prompt_tokens[:]
    elif defect == "empty_response":
        del group.responses[1].tokens[:]
        del group.responses[1].logprobs[:]
    elif defect == "length_mismatch":
        group.responses[1].logprobs.append(-1.0)
    elif defect == "negative_token":
        group.responses[0].tokens[1] = -3
    elif defect == "non_finite_reward":
        group.responses[0].reward = math.nan
    elif defect == "bad_temperature":
        group.temperature = 0.0
    return group


@pytest.mark.parametrize(
    "defect",
    [
        "too_few_responses",
        "missing_id",
        "duplicate_trajectory_id",
        "empty_prompt",
        "empty_response",
        "length_mismatch",
        "negative_token",
        "non_finite_reward",
        "bad_temperature",
    ],
)
def test_each_defect_is_named_by_its_reason_code(defect):
    reason = validate_group(break_group(defect))
    assert reason is not None and reason_code(reason) == defect and defect in DEAD_LETTER_REASONS
    assert "g7" in reason or defect == "too_few_responses"  # the detail names the group


def test_missing_group_or_sampler_id_and_infinite_reward_are_invalid():
    for field in ("group_id", "sampler_id"):
        group = trajectory_group()
        setattr(group, field, "")
        assert validate_group(group) == f"missing_id: {field} is empty"
    group = trajectory_group()
    group.responses[1].reward = -math.inf
    assert reason_code(validate_group(group)) == "non_finite_reward"


def test_a_well_formed_group_passes_even_with_non_finite_logprobs():
    group = trajectory_group(size=2)
    group.responses[0].logprobs[0] = -math.inf
    group.responses[1].logprobs[2] = math.nan
    assert validate_group(group) is None
