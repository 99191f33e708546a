"""Correction weights, valid tokens and mismatch metrics (docs/design.md §4) on hand-computed values."""

import math

import pytest
import torch

from nibble.rl import correction_ratios, correction_weights, k3, mismatch_stats, policy_loss, valid_token_mask

ALL = torch.ones(2, 2, dtype=torch.bool)
RATIOS = [0.25, 0.5, 0.9, 1.0, 2.0, 3.0]  # boundaries 1/C and C are exact powers of two


@pytest.mark.parametrize(
    ("correction", "weights", "limited"),
    [
        ("tis", [0.25, 0.5, 0.9, 1.0, 2.0, 2.0], [0, 0, 0, 0, 0, 1]),
        ("mis", [0.0, 0.5, 0.9, 1.0, 2.0, 0.0], [1, 0, 0, 0, 0, 1]),
        ("rs", [0.0, 1.0, 1.0, 1.0, 1.0, 0.0], [1, 0, 0, 0, 0, 1]),
        ("none", [1.0] * 6, [0] * 6),
    ],
)
def test_weights_per_correction_with_inclusive_range(correction, weights, limited):
    delta = torch.tensor(RATIOS, dtype=torch.float64).log()[None]
    w, lim = correction_weights(delta, correction, 2.0)
    assert w[0].tolist() == pytest.approx(weights, rel=1e-15)
    assert lim[0].tolist() == [bool(x) for x in limited]


def test_undefined_delta_gets_zero_weight_under_every_correction():
    delta = torch.tensor([[float("nan"), float("-inf"), float("inf")]], dtype=torch.float64)
    assert correction_weights(delta, "tis", 2.0)[0].tolist() == [[0.0, 0.0, 2.0]]
    assert correction_weights(delta, "mis", 2.0)[0].tolist() == [[0.0, 0.0, 0.0]]
    assert correction_weights(delta, "none", 2.0)[0].tolist() == [[0.0, 1.0, 1.0]]


def test_valid_tokens_per_level():
    mu = torch.tensor([[-1.0, float("-inf"), -1.0], [-1.0, -1.0, float("nan")], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[True, True, True], [True, True, False], [True, False, False]])
    token = valid_token_mask(mu, mask)
    assert token.tolist() == [[True, False, True], [True, True, False], [True, False, False]]
    for level in ("sequence", "geometric"):
        # row 0 holds a rejected token; row 1's NaN is padding, so row 1 stays
        whole = valid_token_mask(mu, mask, correction_level=level)
        assert whole.tolist() == [[False, False, False], [True, True, False], [True, False, False]]


def test_correction_ratios_are_the_token_ratios_over_valid_tokens():
    mu = torch.tensor([[-1.0, float("-inf"), -2.0], [-0.5, -0.5, -0.5]])
    old = mu.nan_to_num(neginf=0.0) + torch.tensor([[math.log(0.5), 0.0, math.log(3.0)], [0.0, math.log(1.5), 9.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    out = correction_ratios(old, mu, mask)
    assert out.dtype == torch.float32
    assert out.tolist() == pytest.approx([0.5, 3.0, 1.0, 1.5], rel=1e-6)


def test_mismatch_stats_by_hand():
    mu = torch.tensor([[-1.0, -2.0], [-1.0, -3.0]], dtype=torch.float64)
    delta = [[0.1, -0.2], [0.3, 5.0]]  # the 5.0 is padding
    old = mu + torch.tensor(delta, dtype=torch.float64)
    mask = torch.tensor([[True, True], [True, False]])
    stats = mismatch_stats(old, mu, mask)
    k3_sum = sum(math.exp(d) - d - 1 for d in (0.1, -0.2, 0.3))
    assert stats["mismatch_kl"] == pytest.approx(k3_sum / 3, rel=1e-12)
    assert stats["logprob_abs_diff"] == pytest.approx(0.6 / 3, rel=1e-12)
    assert stats["valid_tokens"] == 3


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
def test_mismatch_stats_on_a_row_subset_match_the_loss_stats_of_that_subset(level):
    gen = torch.Generator().manual_seed(1)
    mu = -torch.rand(5, 6, generator=gen) * 2
    mu[3, 1] = float("-inf")
    old = mu + torch.randn(5, 6, generator=gen) * 0.1
    mask = torch.rand(5, 6, generator=gen) < 0.7
    fresh = torch.tensor([0, 3, 4])  # e.g. the staleness-0 rows
    stats = mismatch_stats(old[fresh], mu[fresh], mask[fresh], correction_level=level)
    _, loss_stats = policy_loss(old[fresh], old[fresh], mu[fresh], torch.ones(3), mask[fresh], correction_level=level)
    for key in ("mismatch_kl", "logprob_abs_diff", "valid_tokens"):
        assert stats[key] == loss_stats[key]


def test_k3_by_hand_and_clamped_to_finite():
    d = torch.tensor([0.0, math.log(2.0), -1.0, float("-inf"), float("inf")], dtype=torch.float64)
    out = k3(d)
    assert out[:3].tolist() == pytest.approx([0.0, 1 - math.log(2.0), math.exp(-1.0)], abs=1e-15)
    assert out[3].item() == pytest.approx(math.exp(-80.0) + 80.0 - 1.0)
    assert math.isfinite(out[4].item())


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: correction_weights(torch.zeros(1, 1), "is", 2.0), "correction"),
        (lambda: correction_weights(torch.zeros(1, 1), "tis", 0.9), "cap"),
        (lambda: valid_token_mask(torch.zeros(2, 2), ALL, correction_level="x"), "level"),
        (lambda: valid_token_mask(torch.zeros(2, 2), torch.ones(2, 3, dtype=torch.bool)), "mask"),
        (lambda: mismatch_stats(torch.zeros(2), torch.zeros(2), torch.ones(2, dtype=torch.bool)), "old_logprobs"),
        (lambda: correction_ratios(torch.zeros(2, 2), torch.zeros(2, 3), ALL), "sampler"),
    ],
)
def test_bad_arguments_are_named(call, name):
    with pytest.raises(ValueError, match=name):
        call()
