"""The policy loss of docs/design.md §4: clipped PPO surrogate × train/rollout correction, one token denominator.

Per valid token, with ``ρ = exp(π_θ − π_old)`` and the response's advantage ``A``:

- objective ``min(ρ·A, clip(ρ, 1 − ε_low, 1 + ε_high)·A)`` — PPO's clipped surrogate (Schulman et al.,
  *Proximal Policy Optimization Algorithms*, 2017) with GRPO's group advantages (DeepSeekMath, Shao et al.,
  2024) and DAPO's asymmetric "clip-higher" range (Yu et al., 2025, §3.1; ``ε_low = 0.2``, ``ε_high = 0.28``);
- weighted by the correction ``w`` of :mod:`nibble.rl.correction` (no gradient through ``w``);
- ``loss = (−Σ_valid w·objective + β·Σ_valid k3(π_ref − π_θ)) / N`` with ``N`` the valid tokens of the
  whole consumed batch (DAPO's token-level average, §3.3), so micro-batches and data-parallel ranks
  that share ``N`` sum to the full-batch loss; the k3 term (Schulman, *Approximating KL Divergence*) is
  the optional KL penalty to a reference policy with coefficient ``β = kl_coef``.

Numerics: everything is computed in float64. Tokens that are not valid, or whose weight is 0, are
selected out with ``where`` *before* ``exp`` (the "double where"), so an infinite ratio there cannot turn a
zero gradient into ``0·inf = NaN``. ``log ρ`` is clamped at 80 before ``exp``: identical to the formula
wherever ``ρ < e^80 ≈ 5.5e34`` and finite beyond it (with no gradient there), so loss and gradients are
finite for any finite ``π_θ`` whatever ``π_old`` and ``μ`` hold.
"""

from __future__ import annotations

import torch

from nibble.rl._checks import check_choice, check_floating, check_mask, check_number
from nibble.rl.correction import (
    CORRECTIONS,
    LEVELS,
    correction_weights,
    level_log_ratio,
    mismatch_sums,
    token_log_ratio,
    valid_token_mask,
)
from nibble.rl.kl import k3

# Upper clamp of log ρ before exp (float64); see the module docstring.
RATIO_LOG_LIMIT = 80.0


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    correction: str = "tis",
    correction_level: str = "token",
    cap: float = 2.0,
    num_valid_tokens: int | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss to minimise for one micro-batch, and its statistics.

    Args:
        logprobs: float[B, T], ``π_θ`` of the sampled tokens (the only input that gets a gradient).
        old_logprobs: float[B, T], ``π_old``, the trainer's logprobs before the update.
        sampler_logprobs: float[B, T], ``μ``; −inf/NaN marks a rejected token.
        advantages: float[B], one finite advantage per response (:func:`nibble.rl.group_advantages`).
        mask: bool[B, T], response tokens.
        clip_low, clip_high: ``ε_low`` in ``[0, 1)`` and ``ε_high ≥ 0``.
        correction: ``tis`` | ``mis`` | ``rs`` | ``none``; correction_level: ``token`` | ``sequence`` |
            ``geometric``; cap: ``C ≥ 1``.
        num_valid_tokens: ``N``, the valid tokens of the whole consumed batch over all ranks (sum
            :func:`nibble.rl.valid_token_mask` with the same level); default: this call's valid tokens.
        ref_logprobs: float[B, T], ``π_ref``, needed when ``kl_coef > 0``; kl_coef: ``β ≥ 0``.

    Returns:
        ``(loss, stats)``: a scalar tensor (float32, or float64 for float64 ``logprobs``) and floats
        ``mismatch_kl``, ``logprob_abs_diff``, ``is_clipped_fraction``, ``ppo_clip_fraction`` (means over
        valid tokens, ``0.0`` when there are none), counts ``rejected_tokens`` and ``valid_tokens``, and
        ``kl`` (mean k3 to the reference) when ``ref_logprobs`` is given.

    Raises:
        ValueError: naming the argument whose shape, dtype or value is wrong, or ``num_valid_tokens``
            when it is below this call's valid tokens.
    """
    _check_tensors(logprobs, old_logprobs, sampler_logprobs, advantages, mask, ref_logprobs)
    _check_options(clip_low, clip_high, correction, correction_level, cap, num_valid_tokens, kl_coef, ref_logprobs)
    valid = valid_token_mask(sampler_logprobs, mask, correction_level=correction_level)
    delta = token_log_ratio(old_logprobs, sampler_logprobs, valid)
    weights, limited = correction_weights(level_log_ratio(delta, valid, correction_level), correction, cap)
    active = valid & (weights > 0)
    log_ratio = torch.where(active, logprobs.to(torch.float64) - old_logprobs.detach().to(torch.float64), 0.0)
    adv = advantages.detach().to(torch.float64)[:, None].expand_as(log_ratio)
    objective = _clipped_objective(log_ratio, adv, clip_low, clip_high)
    total = -torch.where(active, weights * objective, 0.0).sum()
    counts = [
        mismatch_sums(delta, valid),
        (limited & valid).sum(),
        _ppo_clipped(logprobs, old_logprobs, adv, valid, clip_low, clip_high).sum(),
        (mask & ~valid).sum(),
    ]
    if ref_logprobs is not None:
        kl = torch.where(valid, _reference_k3(logprobs, ref_logprobs, valid), 0.0).sum()
        total = total + kl_coef * kl
        counts.append(kl.detach())
    values = torch.cat([c.to(torch.float64).reshape(-1) for c in counts]).tolist()
    valid_count = int(values[2])
    if num_valid_tokens is not None and num_valid_tokens < valid_count:
        raise ValueError(f"num_valid_tokens={num_valid_tokens} is below this call's {valid_count} valid tokens")
    denominator = max(valid_count if num_valid_tokens is None else num_valid_tokens, 1)
    loss = (total / denominator).to(torch.promote_types(logprobs.dtype, torch.float32))
    return loss, _stats(values, ref_logprobs is not None)


def _clipped_objective(log_ratio: torch.Tensor, adv: torch.Tensor, clip_low: float, clip_high: float) -> torch.Tensor:
    """float64[B, T]: ``min(ρ·A, clip(ρ, 1 − ε_low, 1 + ε_high)·A)`` with ``ρ = exp(min(log ρ, 80))``."""
    ratio = log_ratio.clamp(max=RATIO_LOG_LIMIT).exp()
    return torch.minimum(ratio * adv, ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv)


@torch.no_grad()
def _ppo_clipped(logprobs, old_logprobs, adv, valid, clip_low: float, clip_high: float) -> torch.Tensor:
    """bool[B, T]: valid tokens whose clipped branch is the minimum and flat (no gradient from PPO)."""
    ratio = (logprobs.to(torch.float64) - old_logprobs.to(torch.float64)).exp()
    high = (adv > 0) & (ratio > 1.0 + clip_high)
    low = (adv < 0) & (ratio < 1.0 - clip_low)
    return valid & (high | low)


def _reference_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """float64[B, T]: ``k3(π_ref − π_θ)`` on valid tokens (``0`` elsewhere, selected before ``exp``)."""
    d = ref_logprobs.detach().to(torch.float64) - logprobs.to(torch.float64)
    return k3(torch.where(valid, d, 0.0))


def _stats(values: list[float], has_reference: bool) -> dict[str, float]:
    mismatch_kl, abs_diff, valid, limited, ppo_clipped, rejected = values[:6]
    per = max(valid, 1.0)
    stats = {
        "mismatch_kl": mismatch_kl / per,
        "logprob_abs_diff": abs_diff / per,
        "is_clipped_fraction": limited / per,
        "ppo_clip_fraction": ppo_clipped / per,
        "rejected_tokens": int(rejected),
        "valid_tokens": int(valid),
    }
    if has_reference:
        stats["kl"] = values[6] / per
    return stats


def _check_tensors(logprobs, old_logprobs, sampler_logprobs, advantages, mask, ref_logprobs) -> None:
    check_floating("logprobs", logprobs, dim=2)
    check_floating("old_logprobs", old_logprobs, shape=logprobs.shape)
    check_floating("sampler_logprobs", sampler_logprobs, shape=logprobs.shape)
    check_floating("advantages", advantages, shape=logprobs.shape[:1])
    check_mask("mask", mask, logprobs.shape)
    if ref_logprobs is not None:
        check_floating("ref_logprobs", ref_logprobs, shape=logprobs.shape)


def _check_options(clip_low, clip_high, correction, correction_level, cap, num_valid_tokens, kl_coef, ref) -> None:
    check_number("clip_low", clip_low, low=0.0, high=1.0, high_open=True)
    check_number("clip_high", clip_high, low=0.0)
    check_choice("correction", correction, CORRECTIONS)
    check_choice("correction_level", correction_level, LEVELS)
    check_number("cap", cap, low=1.0)
    check_number("kl_coef", kl_coef, low=0.0)
    if kl_coef > 0 and ref is None:
        raise ValueError(f"ref_logprobs: required when kl_coef={kl_coef} > 0")
    n = num_valid_tokens
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
        raise ValueError(f"num_valid_tokens={n!r} must be None or a non-negative int")
