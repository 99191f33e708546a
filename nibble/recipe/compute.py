"""Matmuls in the plan's compute dtype, with results that do not depend on the batch shape.

BLAS libraries accumulate in an order that depends on the number of rows (and cuBLAS picks kernels, split-K
included, by shape), and attention kernels by the number of keys, so the same token's output can differ
by an ulp between a prefill over many tokens, a decode step over one, and a CUDA-graph step over a padded
static cache — enough to move a later activation across an NVFP4 rounding boundary and break the
trainer/sampler bit-exact contract (measured on the H200 with SmolLM2-135M before this: mean |Δlogprob|
0.20 at staleness 0). So the unquantised matmuls and attention accumulate in float64 and round once to
the compute dtype (float32 on the CPU, bfloat16 on GPUs): products of float32 or bfloat16 operands are
exact in float64 and their sums nearly so, and different orders then agree except within ~1e-16 of a
rounding boundary. Quantised products run the row-invariant packed GEMM (:mod:`nibble.kernels.gpu.gemm`)
on GPUs, float64 here elsewhere.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

WIDE = torch.float64


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x [..., in] @ weight[out, in].T (+ bias)`` accumulated in float64, returned in ``x``'s dtype."""
    y = F.linear(x.to(WIDE), weight.to(WIDE), None if bias is None else bias.to(WIDE))
    return y.to(x.dtype)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Scaled dot-product attention ``[B, H, T, D]`` with a bool mask ``[B, 1, T, S]``, in float64, returned
    in ``q``'s dtype."""
    return F.scaled_dot_product_attention(q.to(WIDE), k.to(WIDE), v.to(WIDE), attn_mask=mask).to(q.dtype)


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
