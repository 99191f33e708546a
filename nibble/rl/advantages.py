"""Group-relative advantages (docs/design.md §4).

Source: GRPO, *DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models*
(Shao et al., 2024), §4.1.2 "outcome supervision": ``A = (r − mean_group) / std_group``, here with
``1e-6`` added to the sample standard deviation (n − 1). Degenerate groups — a single member, all rewards
equal, or a standard deviation below ``1e-6`` — get ``A = 0`` exactly rather than rounding noise scaled
up by a tiny denominator. DAPO's dynamic sampling (*DAPO: An Open-Source LLM Reinforcement Learning
System at Scale*, Yu et al., 2025, §3.2) drops those groups instead; :func:`zero_std_groups` names them.

Statistics are accumulated in float64 over the groups that ``torch.unique`` finds, so there is no Python
loop over groups. They are computed on the host whatever the inputs' device (the results go back to it): a
batch holds a few thousand rewards, and no CUDA scatter adds a group's members in sample order —
``index_add`` adds with atomics in whatever order its threads run, and ``index_put_(accumulate=True)``
gave last-bit differences from the CPU on an H100 (2026-12-05) — so a trainer on a GPU would get other
advantages than the same batch on a CPU. On the host ``index_put_`` adds each group's members from 0 in
sample order.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from nibble.rl._checks import check_floating, describe

STD_EPS = 1e-6


class _Groups(NamedTuple):
    ids: torch.Tensor  # int64[G], sorted unique group ids
    inverse: torch.Tensor  # int64[N], index of each sample's group in ``ids``
    deviation: torch.Tensor  # float64[N], r − mean_group
    std: torch.Tensor  # float64[G], sample standard deviation (n − 1)
    degenerate: torch.Tensor  # bool[G], single member, all equal, or std < STD_EPS


def group_advantages(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Per-sequence advantage ``A = (r − mean_group) / (std_group + 1e-6)``, ``0`` for degenerate groups.

    Args:
        rewards: float[N], one finite reward per response.
        group_ids: int64[N], the prompt group of each response (any values; need not be contiguous).

    Returns:
        float[N] in the dtype of ``rewards``; exactly ``0`` for every member of a group that has one
        member, all-equal rewards, or a sample standard deviation below ``1e-6``.

    Raises:
        ValueError: naming ``rewards`` or ``group_ids`` when a shape, dtype or value is wrong.
    """
    groups = _group_stats(rewards, group_ids)
    scaled = groups.deviation / (groups.std[groups.inverse] + STD_EPS)
    advantages = torch.where(groups.degenerate[groups.inverse], 0.0, scaled)
    return advantages.to(device=rewards.device, dtype=rewards.dtype)


def zero_std_groups(rewards: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The groups whose advantages are all zero, for ``drop_zero_std_groups`` (DAPO's dynamic sampling).

    Args:
        rewards: float[N]; group_ids: int64[N], as for :func:`group_advantages`.

    Returns:
        ``(ids, zero_std)``: int64[G] the sorted distinct group ids and bool[G] whether that group is
        degenerate (single member, all rewards equal, or std below ``1e-6``). Responses to keep:
        ``~torch.isin(group_ids, ids[zero_std])``; dropped groups: ``int(zero_std.sum())``.
    """
    groups = _group_stats(rewards, group_ids)
    return groups.ids.to(group_ids.device), groups.degenerate.to(group_ids.device)


def _group_stats(rewards: torch.Tensor, group_ids: torch.Tensor) -> _Groups:
    """The groups' statistics, on the host (CPU tensors) whatever the inputs' device."""
    _check(rewards, group_ids)
    ids, inverse, counts = torch.unique(group_ids.cpu(), return_inverse=True, return_counts=True)
    r = rewards.detach().cpu().to(torch.float64)
    zeros = torch.zeros(ids.numel(), dtype=torch.float64)
    mean = _group_sum(zeros, inverse, r) / counts
    deviation = r - mean[inverse]
    variance = _group_sum(zeros, inverse, deviation * deviation) / (counts - 1).clamp(min=1)
    std = variance.sqrt()
    lowest = zeros.scatter_reduce(0, inverse, r, "amin", include_self=False)
    highest = zeros.scatter_reduce(0, inverse, r, "amax", include_self=False)
    degenerate = (counts < 2) | (lowest == highest) | (std < STD_EPS)
    return _Groups(ids, inverse, deviation, std, degenerate)


def _group_sum(zeros: torch.Tensor, inverse: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """float64 ``[G]``: each group's ``values`` added from 0 in sample order (CPU tensors)."""
    return zeros.clone().index_put_((inverse,), values, accumulate=True)


def _check(rewards: torch.Tensor, group_ids: torch.Tensor) -> None:
    check_floating("rewards", rewards, dim=1)
    if not isinstance(group_ids, torch.Tensor) or group_ids.dtype != torch.int64 or group_ids.shape != rewards.shape:
        raise ValueError(f"group_ids: expected int64{list(rewards.shape)}, got {describe(group_ids)}")
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError("rewards: holds a non-finite value (a failed reward must be removed from its group)")
