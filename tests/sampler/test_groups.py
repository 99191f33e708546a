"""A response whose reward failed leaves its group; a group left with fewer than 2 is not written."""

import math

from nibble.sampler.engine import Sample
from nibble.sampler.groups import build_group
from nibble.wire import pb


def outcome(rewards):
    samples = [Sample([4, 5, 2], [-0.1, -0.2, -0.3], "stop") for _ in rewards]
    return build_group(
        example_id="e1",
        prompt_tokens=[1, 7],
        samples=samples,
        rewards=rewards,
        trajectory_ids=[f"t{i}" for i in range(len(rewards))],
        group_id="g",
        policy_version=3,
        sampler_id="s",
        temperature=1.0,
        started_at=0.0,
    )


def test_failed_rewards_are_removed_and_counted():
    result = outcome([1.0, None, math.nan, 0.0])
    assert result.removed == 2
    assert [r.trajectory_id for r in result.group.responses] == ["t0", "t3"]
    assert result.group.policy_version == 3 and result.group.responses[0].finish_reason == pb.STOP


def test_a_group_below_two_responses_is_not_written():
    result = outcome([1.0, None, None])
    assert result.group is None and result.removed == 2
