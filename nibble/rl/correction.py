"""Train/rollout correction (docs/design.md §4): valid tokens, the weight ``w`` and the mismatch metrics.

Per token, ``δ = π_old − μ`` (trainer logprob before the update minus sampler logprob) and ``r = exp(δ)``.
With cap ``C``:

- ``tis``, truncated importance sampling — Yao et al., *Your Efficient RL Framework Secretly Brings You
  Off-Policy RL Training* (2025): ``w = min(r, C)``;
- ``mis``, masked importance sampling — IcePop (inclusionAI, *Small Leak Can Sink a Great Ship — Boost
  RL Training on MoE with IcePop!*, 2025; the Ring-1T report): ``w = r`` where ``r ∈ [1/C, C]``, else ``0``;
- ``rs``, rejection sampling: ``w = 1`` where ``r ∈ [1/C, C]``, else ``0``;
- ``none``: ``w = 1``.

Levels: ``token`` uses each token's ``δ``; ``sequence`` the sum of ``δ`` over the response's valid tokens;
``geometric`` their mean (the geometric mean of the token ratios). Sequence-level and geometric
masking/rejection follow Liu, Li et al., *When Speed Kills Stability: Demystifying RL Collapse from the
Training-Inference Mismatch* (2025).

A token whose ``μ`` is not finite (−inf, NaN) is not valid; at ``sequence`` and ``geometric`` level its
whole response is not valid. An undefined ``δ`` (NaN, from a NaN ``π_old``) gives ``w = 0`` under every
correction.

``mismatch_kl = mean(r − δ − 1)`` is the k3 estimator of KL(sampler ‖ trainer) — Schulman, *Approximating
KL Divergence* (2020), see :mod:`nibble.rl.kl` — and ``logprob_abs_diff = mean|δ|``, both over valid
tokens. Everything here is computed in float64 and carries no gradient.
"""

from __future__ import annotations

import torch

from nibble.rl._checks import check_choice, check_floating, check_mask, check_number
from nibble.rl.kl import k3

CORRECTIONS = ("tis", "mis", "rs", "none")
LEVELS = ("token", "sequence", "geometric")


def valid_token_mask(
    sampler_logprobs: torch.Tensor, mask: torch.Tensor, *, correction_level: str = "token"
) -> torch.Tensor:
    """bool[B, T]: response tokens of ``mask`` whose sampler logprob is finite.

    At ``sequence``/``geometric`` level a response with any rejected token is dropped whole. Summed over
    the whole consumed batch (and all data-parallel ranks), this is the ``num_valid_tokens`` of
    :func:`nibble.rl.policy_loss`.

    Args:
        sampler_logprobs: float[B, T], ``μ``.
        mask: bool[B, T], response tokens.
    """
    _check_level(correction_level)
    _check_pair(sampler_logprobs, mask, "sampler_logprobs")
    valid = mask & torch.isfinite(sampler_logprobs)
    if correction_level == "token":
        return valid
    rejected_response = (mask & ~valid).any(dim=1, keepdim=True)
    return valid & ~rejected_response


def token_log_ratio(old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """float64[B, T]: ``δ = π_old − μ`` on valid tokens, ``0`` elsewhere (selected with ``where``)."""
    delta = old_logprobs.detach().to(torch.float64) - sampler_logprobs.detach().to(torch.float64)
    return torch.where(valid, delta, 0.0)


def level_log_ratio(delta: torch.Tensor, valid: torch.Tensor, correction_level: str) -> torch.Tensor:
    """float64[B, T]: the ``δ`` that sets ``w`` — per token, or the response's sum/mean broadcast over it.

    Args:
        delta: float64[B, T] from :func:`token_log_ratio` (``0`` off the valid tokens).
        valid: bool[B, T].
    """
    _check_level(correction_level)
    if correction_level == "token":
        return delta
    total = delta.sum(dim=1, keepdim=True)
    if correction_level == "geometric":
        total = total / valid.sum(dim=1, keepdim=True).clamp(min=1)
    return total.expand_as(delta)


def correction_weights(delta: torch.Tensor, correction: str, cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights ``w`` (float64[B, T]) and where the correction limited them (bool[B, T]).

    ``limited`` marks tokens truncated by ``tis`` (``r > C``) or masked out by ``mis``/``rs``
    (``r ∉ [1/C, C]``), and any token whose ``δ`` is NaN; it is never set for ``none``.

    Args:
        delta: float64[B, T] from :func:`level_log_ratio`.
        correction: one of ``tis``, ``mis``, ``rs``, ``none``.
        cap: ``C``, finite and at least 1.
    """
    _check_correction(correction, cap)
    r = delta.exp()
    in_range = (r >= 1.0 / cap) & (r <= cap)
    if correction == "tis":
        w, limited = r.clamp(max=cap), ~(r <= cap)
    elif correction == "mis":
        w, limited = torch.where(in_range, r, 0.0), ~in_range
    elif correction == "rs":
        w, limited = in_range.to(torch.float64), ~in_range
    else:
        w, limited = torch.ones_like(r), torch.zeros_like(in_range)
    undefined = torch.isnan(delta)
    return torch.where(undefined, 0.0, w), limited | undefined


def correction_ratios(old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """float32[V]: the per-token ratio ``r = exp(π_old − μ)`` over the V token-level valid tokens.

    The values of the ``nibble_is_weight`` histogram (docs/design.md §6), in row-major order.
    """
    _check_triplet(old_logprobs, sampler_logprobs, mask)
    valid = valid_token_mask(sampler_logprobs, mask)
    return token_log_ratio(old_logprobs, sampler_logprobs, valid)[valid].exp().to(torch.float32)


def mismatch_stats(
    old_logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    correction_level: str = "token",
) -> dict[str, float]:
    """``mismatch_kl``, ``logprob_abs_diff`` and ``valid_tokens`` over the valid tokens of any row subset.

    The same numbers :func:`nibble.rl.policy_loss` reports; call it on the staleness-0 rows for the
    ``nibble_fresh_*`` gauges. Means over zero valid tokens are reported as ``0.0``.

    Args:
        old_logprobs, sampler_logprobs: float[B, T], ``π_old`` and ``μ``.
        mask: bool[B, T], response tokens.
        correction_level: the level whose validity rule applies (whole responses are rejected at
            ``sequence``/``geometric``).
    """
    _check_triplet(old_logprobs, sampler_logprobs, mask)
    valid = valid_token_mask(sampler_logprobs, mask, correction_level=correction_level)
    delta = token_log_ratio(old_logprobs, sampler_logprobs, valid)
    values = mismatch_sums(delta, valid).tolist()
    count = values[2]
    return {
        "mismatch_kl": values[0] / max(count, 1.0),
        "logprob_abs_diff": values[1] / max(count, 1.0),
        "valid_tokens": int(count),
    }


def mismatch_sums(delta: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """float64[3]: ``Σ(r − δ − 1)``, ``Σ|δ|`` and the count, over valid tokens (one device sync to read)."""
    kl = torch.where(valid, k3(delta), 0.0)
    return torch.stack([kl.sum(), delta.abs().sum(), valid.sum().to(torch.float64)])


def _check_pair(values: torch.Tensor, mask: torch.Tensor, name: str) -> None:
    check_floating(name, values, dim=2)
    check_mask("mask", mask, values.shape)


def _check_triplet(old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor) -> None:
    check_floating("old_logprobs", old_logprobs, dim=2)
    check_floating("sampler_logprobs", sampler_logprobs, shape=old_logprobs.shape)
    check_mask("mask", mask, old_logprobs.shape)


def _check_level(correction_level: str) -> None:
    check_choice("correction_level", correction_level, LEVELS)


def _check_correction(correction: str, cap: float) -> None:
    check_choice("correction", correction, CORRECTIONS)
    check_number("cap", cap, low=1.0)
