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

On CUDA with bfloat16 operands (bf16 compute) :func:`linear` instead runs the row-invariant Triton GEMM
(:mod:`nibble.kernels.gpu.dense_gemm`: float32 accumulation in an order fixed by N and K alone, whatever
the number of rows), which spares the float64 GEMMs and the float64 copies of the weights (the LM head's
included) on every call. Likewise :func:`attention` on CUDA in bfloat16 runs the row-invariant
Triton attention (:mod:`nibble.kernels.gpu.attention`: float32 online softmax over key blocks that start at
each sequence's first real key, so padding and the key buffer's length leave a row's bits alone), and
float64 elsewhere. RMSNorm without a gradient on CUDA in bfloat16 runs one fused Triton kernel with the
composition's bits (:func:`runs_rms_norm_kernel`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from nibble.kernels import backend
from nibble.kernels.validation import FLOAT_DTYPES

WIDE = torch.float64


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x [..., in] @ weight[out, in].T (+ bias [out])`` -> ``[..., out]`` in ``x``'s dtype, each row's bits
    independent of the number of rows.

    CUDA tensors all in bfloat16 (bf16 compute): the row-invariant Triton GEMM, float32 accumulation, one
    rounding (:class:`DenseLinear`, differentiable). Everything else (the CPU, float32 compute, mixed
    dtypes): accumulated in float64 and rounded once.
    """
    if runs_dense_gemm(x, weight, bias):
        return dense_linear(x, weight, bias)
    y = F.linear(x.to(WIDE), weight.to(WIDE), None if bias is None else bias.to(WIDE))
    return y.to(x.dtype)


def runs_dense_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether :func:`linear` of these operands runs the Triton GEMM: all on CUDA, all bfloat16, ``weight``
    a matrix, and triton installed."""
    operands = (x, weight) if bias is None else (x, weight, bias)
    return (
        all(t.is_cuda and t.dtype == torch.bfloat16 for t in operands)
        and weight.dim() == 2
        and x.dim() >= 1
        and backend.triton_available()
    )


def dense_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x [..., in] @ weight[out, in].T (+ bias)`` through the row-invariant Triton GEMM (bfloat16 operands,
    on CUDA; under the Triton interpreter, CPU tensors too), in ``x``'s dtype. Through
    :class:`DenseLinear` when a gradient is wanted, a plain launch otherwise (no autograd node)."""
    from nibble.kernels.gpu import dense_gemm  # imports triton: only where the kernel runs

    x2 = x.reshape(-1, x.shape[-1])
    wants_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias))
    if wants_grad:
        y = DenseLinear.apply(x2, weight, bias)
    else:
        y = dense_gemm.matmul(x2, weight, bias, out_dtype=x.dtype)
    return y.reshape(*x.shape[:-1], weight.shape[0])


def _mm_f32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` accumulated in float32 (a float32 result)."""
    if a.is_cuda:
        return torch.mm(a, b, out_dtype=torch.float32)
    return a.to(torch.float32) @ b.to(torch.float32)  # products of bf16 values are exact in float32


class DenseLinear(torch.autograd.Function):
    """``y [M, out] = x [M, in] @ weight[out, in].T (+ bias)``: forward through the row-invariant Triton GEMM
    (:func:`nibble.kernels.gpu.dense_gemm.matmul`, rounded once to ``x``'s dtype), backward through
    ordinary matmuls accumulated in float32 (gradients need no row invariance): ``grad_x = dy @ W``,
    ``grad_W = dy.T @ x``, ``grad_b = Σ dy``, each rounded once to its input's dtype.

    In bf16 compute every operand is bf16 (the weight is its master's bf16 cast, ``bf16_operand``), so
    ``grad_W`` reaches a float32 master through that cast rounded to bf16, as it did when this product
    was accumulated in float64; float32 compute never comes here.
    """

    @staticmethod
    def forward(ctx, x, weight, bias):
        from nibble.kernels.gpu import dense_gemm

        ctx.save_for_backward(x, weight)
        ctx.bias_dtype = None if bias is None else bias.dtype
        return dense_gemm.matmul(x, weight, bias, out_dtype=x.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        dy = dy.to(x.dtype)
        grad_x = _mm_f32(dy, weight).to(x.dtype) if ctx.needs_input_grad[0] else None
        grad_w = _mm_f32(dy.t(), x).to(weight.dtype) if ctx.needs_input_grad[1] else None
        grad_b = None
        if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
            grad_b = dy.sum(0, dtype=torch.float32).to(ctx.bias_dtype)
        return grad_x, grad_w, grad_b


@dataclass(frozen=True)
class AttentionMask:
    """Which keys each query attends to, in the form every caller has: causal over a key buffer whose real
    keys ``key_mask`` marks (left-padded prompts, a static cache's unwritten slots and stopped rows are not
    real).

    Query ``t`` sits at key index ``query_offset + t`` and attends to the real keys up to it. A padding
    query (``query_valid`` False) also attends to its own key, so that its softmax is defined even before
    the first real key; its output is never used (the kernel path gives it what
    :func:`nibble.kernels.gpu.attention.attention` says: its own key is not real, so it is left out).

    Fields:
        key_mask: bool ``[B, S]``, True on real keys.
        query_valid: bool ``[B, T]``, False on padding queries.
        query_offset: int64 ``[1]`` on the keys' device: a tensor, so a captured CUDA graph can advance it.
    """

    key_mask: torch.Tensor
    query_valid: torch.Tensor
    query_offset: torch.Tensor

    @cached_property
    def dense(self) -> torch.Tensor:
        """bool ``[B, 1, T, S]``, True where a query attends to a key."""
        t, s = self.query_valid.shape[1], self.key_mask.shape[1]
        query_pos = self.query_offset + torch.arange(t, device=self.key_mask.device)
        keys = torch.arange(s, device=self.key_mask.device)
        causal = keys[None, :] <= query_pos[:, None]
        own = (keys[None, :] == query_pos[:, None]) & ~self.query_valid[:, :, None]
        return ((causal[None] & self.key_mask[:, None, :]) | own).unsqueeze(1)

    @cached_property
    def key_start(self) -> torch.Tensor:
        """int64 ``[B]``: each sequence's first real key (``S`` when it has none), counted on the device."""
        return (self.key_mask.cumsum(-1) == 0).sum(-1)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask) -> torch.Tensor:
    """Scaled dot-product attention of ``q [B, H, T, D]`` over ``k, v [B, KVH, S, D]`` (``H`` a multiple of
    ``KVH``: query head ``h`` reads key/value head ``h // (H // KVH)``), each row's bits independent of the
    batch, its padding and ``S``; returned ``[B, H, T, D]`` in ``q``'s dtype.

    On CUDA in bfloat16 (:func:`runs_attention_kernel`): the row-invariant Triton kernel, through
    :class:`KernelAttention` when a gradient is wanted. Elsewhere (the CPU; float16 or float64; a head_dim
    beyond the kernel's 256; no triton) in float64 over ``mask.dense``, rounded once: its width, not its
    order, makes it row-invariant.
    """
    if runs_attention_kernel(q, k, v):
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            return KernelAttention.apply(q, k, v, mask)
        return _kernel_attention(q, k, v, mask)
    k, v = _repeat_kv(k, v, q.shape[1])
    return F.scaled_dot_product_attention(q.to(WIDE), k.to(WIDE), v.to(WIDE), attn_mask=mask.dense).to(q.dtype)


def runs_attention_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether :func:`attention` of these operands runs the Triton kernel: all on CUDA, all bfloat16 (the GPU
    compute dtype), head_dim at most 256, and triton installed. float32 compute keeps the float64 path on
    CUDA too, as :func:`linear` does, so that a float32 model gives the CPU's bits on a GPU (the kernel's
    float32 rounding differs from float64's by ~1e-7, enough to move an NVFP4 activation code)."""
    return (
        all(t.is_cuda and t.dtype == torch.bfloat16 for t in (q, k, v))
        and q.shape[-1] <= 256
        and backend.triton_available()
    )


def _repeat_kv(k: torch.Tensor, v: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    groups = heads // k.shape[1]
    return k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)


def _kernel_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask) -> torch.Tensor:
    from nibble.kernels.gpu import attention as kernel  # imports triton: only where the kernel runs

    return kernel.attention(q, k, v, mask.key_mask, mask.key_start, mask.query_offset)


class KernelAttention(torch.autograd.Function):
    """Attention whose forward is the row-invariant kernel (:func:`_kernel_attention`) and whose backward
    recomputes ``softmax(q kᵀ / sqrt(D)) v`` in float32 through differentiable torch ops over
    ``mask.dense`` (gradients need no row invariance), each gradient rounded once to its input's dtype.

    The two agree on every real query row; a padding query row, whose output is never used and so gets a
    zero upstream gradient, follows ``mask.dense`` here.
    """

    @staticmethod
    def forward(ctx, q, k, v, mask):
        ctx.save_for_backward(q, k, v)
        ctx.mask = mask
        return _kernel_attention(q, k, v, mask)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        q, k, v = ctx.saved_tensors
        with torch.enable_grad():
            q32, k32, v32 = (t.detach().to(torch.float32).requires_grad_(True) for t in (q, k, v))
            k_all, v_all = _repeat_kv(k32, v32, q.shape[1])
            out = F.scaled_dot_product_attention(q32, k_all, v_all, attn_mask=ctx.mask.dense)
            grads = torch.autograd.grad(out, (q32, k32, v32), dy.to(torch.float32))
        return *(g.to(t.dtype) for g, t in zip(grads, (q, k, v), strict=True)), None


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


def runs_rms_norm_kernel(x: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether an RMSNorm of ``x [..., n]`` with ``weight [n]`` in compute dtype ``dtype`` runs the fused Triton
    kernel (:func:`nibble.kernels.gpu.rms_norm.rms_norm`: one launch, the composition's bits, measured on the
    GPU by its test): bfloat16 compute, both on one CUDA device in the kernel's dtypes (float32, bfloat16,
    float16), no gradient wanted (sampler decode, scoring: the kernel has no backward) and triton installed."""
    wants_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    return (
        dtype == torch.bfloat16
        and x.is_cuda
        and weight.device == x.device
        and x.dtype in FLOAT_DTYPES
        and weight.dtype in FLOAT_DTYPES
        and not wants_grad
        and backend.triton_available()
    )
