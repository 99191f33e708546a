"""Matmuls in the plan's compute dtype, with results that do not depend on the batch shape.

float32 BLAS accumulates in an order that depends on the number of rows, so the same token's output
can differ by an ulp between a prefill over many tokens and a decode step over one — enough to move a
later activation across an NVFP4 rounding boundary and break the trainer/sampler bit-exact contract.
With float32 compute we therefore accumulate in float64 and round once to float32: different orders
then agree except within ~1e-16 of a float32 rounding boundary. bfloat16 compute (the GPU path)
accumulates in float32 as the hardware does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _wide(dtype: torch.dtype) -> torch.dtype | None:
    return torch.float64 if dtype == torch.float32 else None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x [..., in] @ weight[out, in].T (+ bias)`` in ``x``'s dtype (see the module note on float32)."""
    wide = _wide(x.dtype)
    if wide is None:
        return F.linear(x, weight, bias)
    y = F.linear(x.to(wide), weight.to(wide), None if bias is None else bias.to(wide))
    return y.to(x.dtype)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Scaled dot-product attention ``[B, H, T, D]`` with a bool mask ``[B, 1, T, S]``, same policy."""
    wide = _wide(q.dtype)
    if wide is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return F.scaled_dot_product_attention(q.to(wide), k.to(wide), v.to(wide), attn_mask=mask).to(q.dtype)


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """float32 ``log_softmax`` over the last dim, reduced in float64 so that a row's logprobs do not
    depend on how many rows are computed with it (sampler decode vs trainer scoring)."""
    return torch.log_softmax(logits.to(torch.float64), dim=-1).to(torch.float32)


def softmax(logits: torch.Tensor) -> torch.Tensor:
    """float32 ``softmax`` over the last dim, reduced in float64 (see :func:`log_softmax`)."""
    return torch.softmax(logits.to(torch.float64), dim=-1).to(torch.float32)


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x²) + eps)`` in float32; the mean is reduced in float64 (row-invariant)."""
    x64 = x.to(torch.float64)
    return (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)).to(torch.float32)
