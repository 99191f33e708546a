"""Grouped (per-expert) GEMMs through PyTorch's vendor kernel ``torch._grouped_mm``, with no Triton.

Rows arrive sorted by expert; the group offsets are built on the device, so a whole MoE layer runs
without a device-to-host synchronisation and can be captured in a CUDA graph. Used for bf16 experts and
for the two backward GEMMs of the trainer's quantised experts (:mod:`nibble.recipe.grouped`).
"""

from __future__ import annotations

import torch


def available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``torch._grouped_mm`` serves ``dtype`` tensors on ``device``: CUDA, bf16, and a PyTorch that
    has it (its CUDA kernel takes bf16 only; on the CPU PyTorch runs a slow reference loop)."""
    return device.type == "cuda" and dtype == torch.bfloat16 and hasattr(torch, "_grouped_mm")


def expert_counts(experts: torch.Tensor, num_experts: int) -> torch.Tensor:
    """int64 ``[E]``: how many of the rows ``experts`` (int64 ``[R]``) go to each expert."""
    counts = torch.zeros(num_experts, dtype=torch.int64, device=experts.device)
    return counts.scatter_add_(0, experts, torch.ones_like(experts))


def grouped_mm(x: torch.Tensor, weight: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """``out[r] = x[r] @ weight[experts[r]].T`` in one launch, float32 accumulation.

    Args:
        x: bf16 ``[R, K]``, rows grouped by expert.
        weight: bf16 ``[E, N, K]`` expert stack (contiguous: its transpose is the column-major operand
            the kernel wants).
        experts: int64 ``[R]``, the expert of each row, sorted ascending.
    Returns:
        bf16 ``[R, N]``.
    """
    offsets = torch.cumsum(expert_counts(experts, weight.shape[0]), 0).to(torch.int32)
    return torch._grouped_mm(x, weight.transpose(1, 2), offs=offsets)


def grouped_mm_dgrad(dy: torch.Tensor, weight: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """``out[r] = dy[r] @ weight[experts[r]]`` (the input gradient of :func:`grouped_mm`), one launch.

    Args:
        dy: bf16 ``[R, N]``, rows grouped by expert.
        weight: bf16 ``[E, N, K]`` (row-major: the kernel's row-major right operand).
        experts: int64 ``[R]``, sorted ascending.
    Returns:
        bf16 ``[R, K]``.
    """
    offsets = torch.cumsum(expert_counts(experts, weight.shape[0]), 0).to(torch.int32)
    return torch._grouped_mm(dy, weight, offs=offsets)


def grouped_mm_wgrad(dy: torch.Tensor, x: torch.Tensor, experts: torch.Tensor, num_experts: int) -> torch.Tensor:
    """``out[e] = dy[rows of e].T @ x[rows of e]`` (the weight gradient of :func:`grouped_mm`), one launch.

    The groups run along the contraction dimension (the rows); an expert with no rows gets zeros.

    Args:
        dy: bf16 ``[R, N]``, rows grouped by expert.
        x: bf16 ``[R, K]``, the same rows.
        experts: int64 ``[R]``, sorted ascending.
    Returns:
        bf16 ``[E, N, K]``.
    """
    offsets = torch.cumsum(expert_counts(experts, num_experts), 0).to(torch.int32)
    return torch._grouped_mm(dy.T, x, offs=offsets)
