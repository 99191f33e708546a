"""Row-invariant Triton GEMM for unquantised operands: ``y[M, N] = x[M, K] @ w[N, K].T (+ bias)``.

The unquantised matmuls of the policy (attention projections kept in bf16, the LM head, MoE routers,
bf16 experts, the backward products of :mod:`nibble.recipe.linear`) must give a row the same bits
whatever the number of rows computed with it: the sampler decodes a few rows, the trainer scores
thousands, and the bit-exact logprob contract compares the two. A vendor GEMM picks its kernel (and
split-K) by shape, so its summation order depends on M. Here everything that sets a row's summation
order is fixed or decided from N and K alone, as in the packed NVFP4 GEMM (:mod:`.gemm`):

- one BLOCK_K, BLOCK_N, num_stages and tensor-core operand type for every shape, no autotuning;
- K is split over ``SPLIT_K`` programs only when the column tiles alone are too few to fill the GPU
  (decided from N and K, never from M), each writing float32 partial sums that are then added in split
  order, element by element;
- the row tile (BLOCK_M, num_warps) varies with M (:data:`.row_invariance.ROW_TILES`): it changes which rows a program
  holds, not the order in which a row sums over K. That this gives the same bits is measured, not
  assumed (``tests/kernels/test_dense_gemm.py::test_each_row_gets_the_same_bits_whatever_the_row_count``
  on the GPU); should a compiler ever make it false, a one-entry table restores invariance.

Operands are bfloat16 (the GPU compute dtype): their products are exact in float32, and the dot products
accumulate in float32 (``tl.dot``), with no FMA contraction outside them (``enable_fp_fusion=False``).
The result is rounded once, to bfloat16 or, on request, float32; an optional bias is added in float32
before that rounding.

Without CUDA the same kernel runs under Triton's interpreter (CPU tests) with float32 operands and float32
dot products: the interpreter's half-precision dots are not faithful, and bf16 values are exact in float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import row_invariance
from .row_invariance import row_tile, sum_in_split_order

BLOCK_N = 64
_CUDA_CONFIG = {"BLOCK_N": BLOCK_N, "BLOCK_K": 64, "num_stages": 4}
# The Triton interpreter (CPU tests) runs a smaller tile, so that small test shapes cover several tiles.
_INTERPRETER_CONFIG = {"BLOCK_N": 32, "BLOCK_K": 32}
OUT_DTYPES = (torch.bfloat16, torch.float32)


@triton.jit
def dense_gemm_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    K,
    CHUNK,
    STATIC_CHUNK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    """``out[m, n] = Σ_k x[m, k] w[n, k] (+ bias[n])`` for contiguous ``x [M, K]``, ``w [N, K]``.

    Program ``(pid_m, pid_n, pid_k)`` sums ``k`` in ``[pid_k * CHUNK, (pid_k + 1) * CHUNK) ∩ [0, K)``
    (``CHUNK`` a multiple of ``BLOCK_K``) in steps of ``BLOCK_K``, the same steps for every row. With
    ``SPLIT_K == 1`` it writes the result (plus the float32 ``bias``) in ``out``'s dtype; otherwise float32
    partial sums to slice ``pid_k`` of ``out`` ``[SPLIT_K, M, N]`` (the caller adds them and the bias).
    ``STATIC_CHUNK``: 0 on GPUs (``CHUNK`` is a runtime value: no recompilation per K); ``CHUNK`` under
    the interpreter, whose loops cannot take a runtime bound.
    """
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    rows = tl.where(row_ok, rows, 0).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    cols = tl.where(col_ok, cols, 0).to(tl.int64)
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_start = pid_k * CHUNK
    # the interpreter's loops need a Python int bound (and turn every assigned value into a tensor)
    for step in tl.range(0, STATIC_CHUNK if STATIC_CHUNK > 0 else CHUNK, BLOCK_K):
        k = k_start + step + ks
        k_ok = k < K
        a = tl.load(x_ptr + rows[:, None] * K + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(w_ptr + cols[None, :] * K + k[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc = tl.dot(a.to(DOT_DTYPE), b.to(DOT_DTYPE), acc)
    out_offs = rows[:, None] * N + cols[None, :]
    out_mask = row_ok[:, None] & col_ok[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc = acc + tl.load(bias_ptr + cols, mask=col_ok, other=0.0)[None, :]
        tl.store(out_ptr + out_offs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        tl.store(out_ptr + pid_k.to(tl.int64) * M * N + out_offs, acc, mask=out_mask)


def split_k(n: int, k: int, device: torch.device) -> int:
    """How many programs share K for an ``[N, K]`` weight (:func:`.row_invariance.split_k` of its
    ``cdiv(N, BLOCK_N)`` column tiles), the same for every M."""
    block_n = (_CUDA_CONFIG if device.type == "cuda" else _INTERPRETER_CONFIG)["BLOCK_N"]
    return row_invariance.split_k(triton.cdiv(n, block_n), k, device)


def matmul(
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    tile: tuple[int, int] | None = None,
) -> torch.Tensor:
    """``x @ w.T (+ bias)``, each row's bits independent of the number of rows.

    Args:
        x: ``[M, K]`` (M ≥ 0), any strides (made contiguous).
        w: ``[N, K]``, any strides, same dtype and device as ``x``.
        bias: optional ``[N]``; added in float32 before the single rounding.
        out_dtype: bfloat16 or float32; by default ``x``'s dtype.
        tile: ``(BLOCK_M, num_warps)`` forced (tests, benchmarks); by default :func:`row_tile` of M.
    Operands are bfloat16 on CUDA; under the interpreter (CPU tensors) bfloat16 or float32.
    Returns ``[M, N]`` in ``out_dtype``, float32 accumulation.
    Raises:
        ValueError: operands of the wrong rank, shapes, dtypes or devices.
    """
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"dense GEMM needs x [M, K] and w [N, K], got {tuple(x.shape)} and {tuple(w.shape)}")
    cuda = x.is_cuda
    allowed = (torch.bfloat16,) if cuda else (torch.bfloat16, torch.float32)
    if x.dtype not in allowed or w.dtype != x.dtype or x.device != w.device:
        raise ValueError(
            f"dense GEMM operands must share a dtype in {allowed} and a device, got {x.dtype} on {x.device} "
            f"and {w.dtype} on {w.device}"
        )
    out_dtype = x.dtype if out_dtype is None else out_dtype
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"dense GEMM out_dtype must be one of {OUT_DTYPES}, got {out_dtype}")
    m, k = x.shape
    n = w.shape[0]
    if bias is not None and (bias.shape != (n,) or bias.device != x.device):
        raise ValueError(f"bias must be [{n}] on {x.device}, got {tuple(bias.shape)} on {bias.device}")
    if m == 0 or n == 0:
        return torch.empty((m, n), dtype=out_dtype, device=x.device)
    if k == 0:  # an empty sum
        y = torch.zeros((m, n), dtype=torch.float32, device=x.device)
        return (y if bias is None else y + bias.to(torch.float32)).to(out_dtype)
    if not cuda:  # the interpreter multiplies in float32 (bf16 -> float32 is exact)
        x, w = x.to(torch.float32), w.to(torch.float32)
    x, w = x.contiguous(), w.contiguous()
    b = None if bias is None else bias.to(torch.float32).contiguous()
    block_m, num_warps = tile or row_tile(m, x.device)
    config = _CUDA_CONFIG if cuda else _INTERPRETER_CONFIG
    split = split_k(n, k, x.device)
    chunk = triton.cdiv(k, split * config["BLOCK_K"]) * config["BLOCK_K"]
    # the interpreter writes float32 (rounded here, as the GPU would: round to nearest even)
    kernel_dtype = out_dtype if cuda else torch.float32
    shape = (m, n) if split == 1 else (split, m, n)
    target = torch.empty(shape, dtype=kernel_dtype if split == 1 else torch.float32, device=x.device)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, config["BLOCK_N"]), split)
    args = (x, w, x if b is None else b, target, m, n, k, chunk)
    if cuda:
        dense_gemm_kernel[grid](
            *args, STATIC_CHUNK=0, HAS_BIAS=b is not None, SPLIT_K=split, BLOCK_M=block_m, **config,
            num_warps=num_warps,
            DOT_DTYPE=tl.bfloat16, enable_fp_fusion=False,
        )  # fmt: skip
    else:
        dense_gemm_kernel[grid](
            *args, STATIC_CHUNK=chunk, HAS_BIAS=b is not None, SPLIT_K=split, BLOCK_M=block_m, **config,
            DOT_DTYPE=tl.float32,
        )  # fmt: skip
    if split > 1:
        total = sum_in_split_order(target)
        if b is not None:
            total += b
        target = total
    return target.to(out_dtype)
