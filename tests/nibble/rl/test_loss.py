"""The policy loss (docs/design.md §4) against hand-computed values, and its numerical guarantees.

The base batch (float64) has two responses and three positions; the last position of row 1 is padding.
Per valid token, with ``r = exp(π_old − μ)`` and ``ρ = exp(π_θ − π_old)``:

    row 0, A = 1:     r = [0.4, 3, 1.6]   ρ = [1.1, 1.5, 0.7]
    row 1, A = −0.5:  r = [1.5, 0.25]     ρ = [0.5, 1.5]

Clipped objective min(ρA, clip(ρ, 0.8, 1.28)A): row 0 [1.1, 1.28, 0.7] (ρ = 1.5 clipped), row 1
[−0.4, −0.75] (ρ = 0.5 clipped: min(−0.25, −0.4)), so 2 of 5 tokens are PPO-clipped. N = 5.
"""

import math

import pytest
import torch

from nibble.rl import policy_loss, valid_token_mask

MU = [[-1.0, -2.0, -0.5], [-0.3, -1.2, -0.7]]
R = [[0.4, 3.0, 1.6], [1.5, 0.25, 1.0]]
RHO = [[1.1, 1.5, 0.7], [0.5, 1.5, 1.0]]
ADV = [1.0, -0.5]
OBJECTIVE = [[1.1, 1.28, 0.7], [-0.4, -0.75]]


def base_batch(rho=RHO):
    mu = torch.tensor(MU, dtype=torch.float64)
    old = mu + torch.tensor(R, dtype=torch.float64).log()
    new = (old + torch.tensor(rho, dtype=torch.float64).log()).requires_grad_()
    mask = torch.tensor([[True, True, True], [True, True, False]])
    return new, old, mu, torch.tensor(ADV, dtype=torch.float64), mask


def weighted_loss(weights, n=5):
    """−Σ w·objective / N over the base batch's valid tokens, weights per row as written."""
    return -sum(w * o for ws, os in zip(weights, OBJECTIVE, strict=True) for w, o in zip(ws, os, strict=True)) / n


G0, G1 = 1.92 ** (1 / 3), 0.375**0.5  # geometric means of the row ratios (0.4·3·1.6 = 1.92, 1.5·0.25 = 0.375)
EXPECTED = {
    # token level: tis min(r, 2); mis r in [0.5, 2] else 0; rs 1 in [0.5, 2] else 0
    ("tis", "token"): (weighted_loss([[0.4, 2.0, 1.6], [1.5, 0.25]]), 1 / 5),
    ("mis", "token"): (weighted_loss([[0.0, 0.0, 1.6], [1.5, 0.0]]), 3 / 5),
    ("rs", "token"): (weighted_loss([[0.0, 0.0, 1.0], [1.0, 0.0]]), 3 / 5),
    ("none", "token"): (weighted_loss([[1.0, 1.0, 1.0], [1.0, 1.0]]), 0.0),
    # sequence level: row ratios 1.92 (in range) and 0.375 (out of range)
    ("tis", "sequence"): (weighted_loss([[1.92] * 3, [0.375] * 2]), 0.0),
    ("mis", "sequence"): (weighted_loss([[1.92] * 3, [0.0] * 2]), 2 / 5),
    ("rs", "sequence"): (weighted_loss([[1.0] * 3, [0.0] * 2]), 2 / 5),
    ("none", "sequence"): (weighted_loss([[1.0] * 3, [1.0] * 2]), 0.0),
    # geometric level: 1.92^(1/3) ≈ 1.243 and 0.375^(1/2) ≈ 0.612, both in range
    ("tis", "geometric"): (weighted_loss([[G0] * 3, [G1] * 2]), 0.0),
    ("mis", "geometric"): (weighted_loss([[G0] * 3, [G1] * 2]), 0.0),
    ("rs", "geometric"): (weighted_loss([[1.0] * 3, [1.0] * 2]), 0.0),
    ("none", "geometric"): (weighted_loss([[1.0] * 3, [1.0] * 2]), 0.0),
}
CORRECTIONS = ("tis", "mis", "rs", "none")
LEVELS = ("token", "sequence", "geometric")


@pytest.mark.parametrize(("correction", "level"), list(EXPECTED))
def test_hand_computed_loss_and_clip_fractions(correction, level):
    loss, stats = policy_loss(*base_batch(), correction=correction, correction_level=level)
    expected_loss, expected_is_clipped = EXPECTED[correction, level]
    assert loss.item() == pytest.approx(expected_loss, rel=1e-12)
    assert stats["is_clipped_fraction"] == pytest.approx(expected_is_clipped)
    assert stats["ppo_clip_fraction"] == pytest.approx(2 / 5)
    assert stats["valid_tokens"] == 5 and stats["rejected_tokens"] == 0


def test_spot_values_of_the_hand_computed_table():
    # Written out, so that a slip in weighted_loss cannot hide: 0.44 + 2.56 + 1.12 − 0.6 − 0.1875 = 3.3325.
    assert EXPECTED["tis", "token"][0] == pytest.approx(-0.6665)
    assert EXPECTED["mis", "token"][0] == pytest.approx(-(1.12 - 0.6) / 5)
    assert EXPECTED["tis", "sequence"][0] == pytest.approx(-(1.92 * 3.08 - 0.375 * 1.15) / 5)


def test_mismatch_stats_in_the_loss_stats():
    _, stats = policy_loss(*base_batch(), correction_level="sequence")
    rs = [0.4, 3.0, 1.6, 1.5, 0.25]
    assert stats["mismatch_kl"] == pytest.approx(sum(r - math.log(r) - 1 for r in rs) / 5, rel=1e-12)
    assert stats["logprob_abs_diff"] == pytest.approx(sum(abs(math.log(r)) for r in rs) / 5, rel=1e-12)
    assert "kl" not in stats


def test_defaults_are_tis_token_with_dapo_clip_range():
    default, _ = policy_loss(*base_batch())
    explicit, _ = policy_loss(*base_batch(), clip_low=0.2, clip_high=0.28, correction="tis", cap=2.0)
    assert default.item() == explicit.item() == pytest.approx(EXPECTED["tis", "token"][0])


def test_gradient_in_the_unclipped_region_is_minus_w_a_rho_over_n():
    rho = [[1.1, 1.2, 0.9], [0.85, 1.25, 1.0]]  # inside [0.8, 1.28]: the unclipped branch everywhere
    new, *rest = base_batch(rho)
    loss, stats = policy_loss(new, *rest)
    loss.backward()
    w = [[0.4, 2.0, 1.6], [1.5, 0.25, 0.0]]
    adv = [1.0, -0.5]
    expected = [[-w[b][t] * adv[b] * rho[b][t] / 5 for t in range(3)] for b in range(2)]
    expected[1][2] = 0.0  # padding
    torch.testing.assert_close(new.grad, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=0)
    assert stats["ppo_clip_fraction"] == 0.0


def test_gradient_is_zero_where_ppo_clips():
    new, *rest = base_batch()
    policy_loss(new, *rest)[0].backward()
    assert new.grad[0, 1].item() == 0.0  # A > 0, ρ = 1.5 > 1.28
    assert new.grad[1, 0].item() == 0.0  # A < 0, ρ = 0.5 < 0.8
    assert new.grad[0, 0].item() == pytest.approx(-0.4 * 1.0 * 1.1 / 5)


@pytest.mark.parametrize("bad", [float("-inf"), float("nan")])
def test_rejected_token_at_token_level(bad):
    new, old, mu, adv, mask = base_batch()
    mu[0, 1] = bad
    loss, stats = policy_loss(new, old, mu, adv, mask)
    # the r = 3 token leaves: 0.4·1.1 + 1.6·0.7 + 1.5·(−0.4) + 0.25·(−0.75) = 0.7725 over 4 tokens
    assert loss.item() == pytest.approx(-0.7725 / 4, rel=1e-12)
    assert stats["rejected_tokens"] == 1 and stats["valid_tokens"] == 4
    assert stats["is_clipped_fraction"] == 0.0  # 0.4, 1.6, 1.5, 0.25 are not truncated by tis
    loss.backward()
    assert new.grad[0, 1].item() == 0.0


@pytest.mark.parametrize("bad", [float("-inf"), float("nan")])
@pytest.mark.parametrize(("level", "row1_weight"), [("sequence", 0.375), ("geometric", G1)])
def test_rejected_token_rejects_its_response_at_sequence_levels(bad, level, row1_weight):
    new, old, mu, adv, mask = base_batch()
    mu[0, 1] = bad
    loss, stats = policy_loss(new, old, mu, adv, mask, correction_level=level)
    # only row 1 is left: tis weight min(row ratio, 2) on objectives −0.4 and −0.75, over 2 tokens
    assert loss.item() == pytest.approx(-(row1_weight * -1.15) / 2, rel=1e-12)
    assert stats["rejected_tokens"] == 3 and stats["valid_tokens"] == 2
    loss.backward()
    assert new.grad[0].tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("correction", CORRECTIONS)
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize(
    ("old_value", "mu_value"), [(float("-inf"), -1.0), (-1e30, float("-inf")), (0.0, float("nan"))]
)
def test_masked_token_with_infinite_ratio_changes_nothing(correction, level, old_value, mu_value):
    new, old, mu, adv, mask = base_batch()
    old[1, 2], mu[1, 2] = old_value, mu_value  # padding: ρ = exp(π_θ − π_old) = inf or NaN there
    new.data[1, 2] = 0.0
    loss, stats = policy_loss(new, old, mu, adv, mask, correction=correction, correction_level=level)
    loss.backward()
    assert loss.item() == pytest.approx(EXPECTED[correction, level][0], rel=1e-12)
    assert torch.isfinite(new.grad).all() and new.grad[1, 2].item() == 0.0
    assert all(math.isfinite(v) for v in stats.values())


@pytest.mark.parametrize("correction", CORRECTIONS)
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize(
    ("old_value", "mu_value"),
    [(-1e4, -1.0), (float("-inf"), -1.0), (-0.1, -1e4), (-1e4, -1e4), (-1e30, -0.5), (0.0, -1e-30)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_extreme_old_or_sampler_logprobs_on_valid_tokens_give_finite_loss_and_grads(
    correction, level, old_value, mu_value, dtype
):
    new, old, mu, adv, mask = base_batch()
    old[:, 0], mu[:, 0] = old_value, mu_value  # ρ up to e^(1e30) on a valid token, A of both signs
    new = new.detach().to(dtype).requires_grad_()
    loss, _ = policy_loss(
        new, old.to(dtype), mu.to(dtype), adv.to(dtype), mask, correction=correction, correction_level=level
    )
    loss.backward()
    assert torch.isfinite(loss) and loss.dtype == torch.float32
    assert torch.isfinite(new.grad).all()


def test_nan_old_logprob_on_a_valid_token_gets_zero_weight():
    new, old, mu, adv, mask = base_batch()
    old[0, 1] = float("nan")
    for correction in CORRECTIONS:
        loss, stats = policy_loss(new, old, mu, adv, mask, correction=correction)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(new.grad).all()
        assert new.grad[0, 1].item() == 0.0 and stats["valid_tokens"] == 5
        new.grad = None


def test_num_valid_tokens_denominator_sums_micro_batches_to_the_full_batch():
    gen = torch.Generator().manual_seed(0)
    b, t = 6, 7
    mu = -torch.rand(b, t, generator=gen, dtype=torch.float64) * 3
    mu[1, 2], mu[4, 0] = float("-inf"), float("nan")
    old = mu + torch.randn(b, t, generator=gen, dtype=torch.float64) * 0.5
    new = old + torch.randn(b, t, generator=gen, dtype=torch.float64) * 0.3
    ref = old + torch.randn(b, t, generator=gen, dtype=torch.float64) * 0.2
    adv = torch.randn(b, generator=gen, dtype=torch.float64)
    mask = torch.rand(b, t, generator=gen) < 0.8
    for correction in CORRECTIONS:
        for level in LEVELS:
            kwargs = {"correction": correction, "correction_level": level, "ref_logprobs": None, "kl_coef": 0.1}
            full = new.clone().requires_grad_()
            loss, _ = policy_loss(full, old, mu, adv, mask, **{**kwargs, "ref_logprobs": ref})
            loss.backward()
            n = int(valid_token_mask(mu, mask, correction_level=level).sum())
            parts, summed = [], 0.0
            for rows in (slice(0, 2), slice(2, 6)):
                part = new[rows].clone().requires_grad_()
                kwargs["ref_logprobs"] = ref[rows]
                micro, _ = policy_loss(part, old[rows], mu[rows], adv[rows], mask[rows], num_valid_tokens=n, **kwargs)
                micro.backward()
                summed, parts = summed + micro.item(), [*parts, part.grad]
            assert summed == pytest.approx(loss.item(), rel=1e-12, abs=1e-15)
            torch.testing.assert_close(torch.cat(parts), full.grad, rtol=1e-12, atol=1e-15)


def test_k3_penalty_to_a_reference_is_added_with_the_same_denominator():
    rho = [[1.0] * 3, [1.0] * 3]  # first step: ρ ≡ 1, objective = A
    new, old, mu, adv, mask = base_batch(rho)
    d = torch.tensor([[math.log(2.0), -1.0, 0.0], [0.5, 0.0, 40.0]], dtype=torch.float64)  # π_ref − π_θ
    ref = new.detach() + d
    loss, stats = policy_loss(new, old, mu, adv, mask, correction="none", ref_logprobs=ref, kl_coef=0.1)
    # k3(d) = e^d − d − 1: (1 − ln 2) + e^−1 + 0 + (e^0.5 − 1.5) + 0; the padding's d = 40 is not counted
    k3_sum = (1 - math.log(2)) + math.exp(-1) + (math.exp(0.5) - 1.5)
    surrogate = -(3 * 1.0 + 2 * -0.5) / 5
    assert loss.item() == pytest.approx(surrogate + 0.1 * k3_sum / 5, rel=1e-12)
    assert stats["kl"] == pytest.approx(k3_sum / 5, rel=1e-12)
    loss.backward()
    # d/dπ_θ [−A + β·k3(π_ref − π_θ)] / N = (−A + β·(1 − e^d)) / N
    expected = [[(-a + 0.1 * (1 - math.exp(x))) / 5 for x in row] for a, row in zip(ADV, d.tolist(), strict=True)]
    expected[1][2] = 0.0
    torch.testing.assert_close(new.grad, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-15)


def test_no_valid_tokens_gives_zero_loss_and_zero_stats():
    new, old, mu, adv, _ = base_batch()
    loss, stats = policy_loss(new, old, mu, adv, torch.zeros(2, 3, dtype=torch.bool))
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(new.grad, torch.zeros_like(new))
    assert stats["valid_tokens"] == 0 and stats["mismatch_kl"] == 0.0


def test_bf16_inputs_give_a_float32_loss_with_grads_in_bf16():
    new, old, mu, adv, mask = base_batch()
    new = new.detach().bfloat16().requires_grad_()
    loss, _ = policy_loss(new, old.bfloat16(), mu.bfloat16(), adv.bfloat16(), mask)
    loss.backward()
    assert loss.dtype == torch.float32 and new.grad.dtype == torch.bfloat16
    assert loss.item() == pytest.approx(EXPECTED["tis", "token"][0], rel=2e-2)  # bf16 keeps 8 mantissa bits


def bad_call(**overrides):
    new, old, mu, adv, mask = base_batch()
    args = {"logprobs": new, "old_logprobs": old, "sampler_logprobs": mu, "advantages": adv, "mask": mask}
    args.update(overrides)
    tensors = [args.pop(k) for k in ("logprobs", "old_logprobs", "sampler_logprobs", "advantages", "mask")]
    return policy_loss(*tensors, **args)


@pytest.mark.parametrize(
    ("overrides", "name"),
    [
        ({"logprobs": torch.zeros(2, 3, dtype=torch.int64)}, "logprobs"),
        ({"logprobs": torch.zeros(6)}, "logprobs"),
        ({"old_logprobs": torch.zeros(2, 4)}, "old_logprobs"),
        ({"sampler_logprobs": torch.zeros(3, 3)}, "sampler_logprobs"),
        ({"advantages": torch.zeros(2, 1)}, "advantages"),
        ({"mask": torch.ones(2, 3)}, "mask"),
        ({"ref_logprobs": torch.zeros(2, 2)}, "ref_logprobs"),
        ({"clip_low": 1.0}, "clip_low"),
        ({"clip_high": -0.1}, "clip_high"),
        ({"correction": "ppo"}, "correction"),
        ({"correction_level": "batch"}, "correction_level"),
        ({"cap": 0.5}, "cap"),
        ({"cap": float("inf")}, "cap"),
        ({"kl_coef": 0.1}, "ref_logprobs"),
        ({"kl_coef": -1.0}, "kl_coef"),
        ({"num_valid_tokens": -1}, "num_valid_tokens"),
        ({"num_valid_tokens": 5.0}, "num_valid_tokens"),
        ({"num_valid_tokens": True}, "num_valid_tokens"),
        ({"num_valid_tokens": 4}, "num_valid_tokens"),  # below this call's 5 valid tokens
    ],
)
def test_bad_arguments_are_named(overrides, name):
    with pytest.raises(ValueError, match=name):
        bad_call(**overrides)
