"""Group advantages (docs/design.md §4) against hand-computed values and a per-group loop."""

import math

import pytest
import torch

from nibble.rl import group_advantages, zero_std_groups


def test_hand_computed_groups_with_interleaved_noncontiguous_ids():
    rewards = torch.tensor([1.0, 2.0, 0.0, 0.0, 4.0, 0.0], dtype=torch.float64)
    ids = torch.tensor([7, 3, 7, 7, 3, 7])
    # group 7: [1, 0, 0, 0], mean 0.25, squared deviations 0.5625 + 3·0.0625 = 0.75, std sqrt(0.75 / 3) = 0.5
    # group 3: [2, 4], mean 3, std sqrt((1 + 1) / 1) = sqrt(2)
    a7, a3 = 0.5 + 1e-6, math.sqrt(2) + 1e-6
    expected = [0.75 / a7, -1 / a3, -0.25 / a7, -0.25 / a7, 1 / a3, -0.25 / a7]
    assert group_advantages(rewards, ids).tolist() == pytest.approx(expected, rel=1e-12)


def test_float32_in_float32_out():
    rewards = torch.tensor([0.0, 1.0, 1.0])
    out = group_advantages(rewards, torch.zeros(3, dtype=torch.int64))
    assert out.dtype == torch.float32
    # mean 2/3, deviations [-2/3, 1/3, 1/3], variance (4/9 + 2/9) / 2 = 1/3
    std = math.sqrt(1 / 3) + 1e-6
    assert out.tolist() == pytest.approx([-2 / 3 / std, 1 / 3 / std, 1 / 3 / std], rel=1e-6)


@pytest.mark.parametrize(
    ("rewards", "why"),
    [
        ([0.1, 0.1, 0.1], "all equal (0.1 is not exact in binary: the mean carries rounding noise)"),
        ([1e10, 1e10, 1e10, 1e10], "all equal and large"),
        ([1.0, 1.0 + 1e-7], "std 1e-7 / sqrt(2) below 1e-6"),
        ([0.5], "a single member"),
    ],
)
def test_degenerate_groups_get_exactly_zero(rewards, why):
    for dtype in (torch.float32, torch.float64):
        r = torch.tensor(rewards, dtype=dtype)
        out = group_advantages(r, torch.full_like(r, 5, dtype=torch.int64))
        assert torch.equal(out, torch.zeros_like(r)), why


def test_std_just_above_the_threshold_is_kept():
    # [0, 2e-6]: mean 1e-6, std sqrt(2 · 1e-12) = 1.414e-6 ≥ 1e-6
    out = group_advantages(torch.tensor([0.0, 2e-6], dtype=torch.float64), torch.tensor([0, 0]))
    expected = 1e-6 / (math.sqrt(2) * 1e-6 + 1e-6)
    assert out.tolist() == pytest.approx([-expected, expected], rel=1e-9)


def test_degenerate_groups_do_not_disturb_the_others():
    rewards = torch.tensor([3.0, 0.0, 3.0, 1.0, 7.0])
    ids = torch.tensor([0, 1, 0, 1, 2])
    out = group_advantages(rewards, ids)
    assert out[[0, 2, 4]].tolist() == [0.0, 0.0, 0.0]
    a = 0.5 / (math.sqrt(0.5) + 1e-6)  # group 1: [0, 1], mean 0.5, std sqrt(0.5)
    assert out[[1, 3]].tolist() == pytest.approx([-a, a], rel=1e-6)
    assert not torch.isnan(out).any()


def group_advantages_ref(rewards: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """A loop over groups with torch.std (n − 1)."""
    out = torch.zeros_like(rewards, dtype=torch.float64)
    for g in ids.unique():
        members = ids == g
        r = rewards[members].double()
        if r.numel() > 1 and r.max() != r.min() and r.std() >= 1e-6:
            out[members] = (r - r.mean()) / (r.std() + 1e-6)
    return out.to(rewards.dtype)


def test_vectorised_sut_matches_a_per_group_loop_ref():
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 40, (500,), generator=gen) * 3
    rewards = torch.randint(0, 3, (500,), generator=gen).float() + torch.randn(500, generator=gen) * (ids % 2)
    sut, ref = group_advantages(rewards, ids), group_advantages_ref(rewards, ids)
    torch.testing.assert_close(sut, ref, rtol=1e-6, atol=0)  # float64 statistics, one float32 rounding each


def test_group_sums_add_members_in_sample_order():
    """A group's sums run from 0 over its members in sample order: [1e16, 1, -1e16, 1] sums to 1 that way
    (1e16 + 1 rounds back to 1e16), to 0 or 2 in other orders."""
    rewards = torch.tensor([1e16, 5.0, 1.0, -1e16, 1.0], dtype=torch.float64)
    ids = torch.tensor([0, 1, 0, 0, 0])
    mean = 1.0 / 4
    deviation = torch.tensor([1e16 - mean, 1.0 - mean, -1e16 - mean, 1.0 - mean], dtype=torch.float64)
    squares = 0.0
    for d in deviation.tolist():
        squares += d * d
    std = math.sqrt(squares / 3)
    expected = (deviation / (std + 1e-6)).tolist()
    assert group_advantages(rewards, ids)[[0, 2, 3, 4]].tolist() == expected


@pytest.mark.gpu
def test_cuda_gives_the_cpu_bits_on_every_call():
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 300, (20_000,), generator=gen)
    rewards = torch.randn(20_000, generator=gen, dtype=torch.float64) * 1e3
    expected = group_advantages(rewards, ids)
    for _ in range(3):
        out = group_advantages(rewards.cuda(), ids.cuda()).cpu()
        assert torch.equal(out.view(torch.int64), expected.view(torch.int64))


def test_zero_std_groups_marks_degenerate_groups():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 2.0, 2.0 + 1e-8])
    ids = torch.tensor([4, 4, 9, 9, 1, 1])
    groups, zero_std = zero_std_groups(rewards, ids)
    assert groups.tolist() == [1, 4, 9]
    assert zero_std.tolist() == [True, True, False]
    keep = ~torch.isin(ids, groups[zero_std])
    assert keep.tolist() == [False, False, True, True, False, False]


def test_empty_batch():
    out = group_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.int64))
    assert out.shape == (0,)


@pytest.mark.parametrize(
    ("rewards", "ids", "name"),
    [
        (torch.tensor([1, 2]), torch.tensor([0, 0]), "rewards"),
        (torch.zeros(2, 2), torch.tensor([0, 0]), "rewards"),
        (torch.tensor([1.0, float("nan")]), torch.tensor([0, 0]), "rewards"),
        (torch.tensor([1.0, 2.0]), torch.tensor([0, 0], dtype=torch.int32), "group_ids"),
        (torch.tensor([1.0, 2.0]), torch.tensor([0, 0, 0]), "group_ids"),
    ],
)
def test_bad_arguments_are_named(rewards, ids, name):
    with pytest.raises(ValueError, match=name):
        group_advantages(rewards, ids)
