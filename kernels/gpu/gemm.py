"""Launchers for the Triton NVFP4 GEMM: dense ``x @ W.T`` and grouped (one launch per MoE layer)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..tensors import NVFP4_BLOCK, NVFP4Tensor
from . import grouped
from .nvfp4 import dequantize
from .nvfp4_gemm import nvfp4_gemm_kernel
from .row_invariance import row_tile, split_k, sum_in_split_order

# Row invariance (:mod:`.row_invariance`): one BLOCK_K and operand type for every row count, K split by the
# column tiles alone, the row tile from the rows per weight matrix. The dequantise-and-vendor-GEMM form below
# stays for benchmarks/kernels_gpu.py to measure against.
BLOCK_N = 64
_CUDA_CONFIG = {"BLOCK_N": BLOCK_N, "BLOCK_K": 128, "num_stages": 4}
# The Triton interpreter (CPU tests) runs a smaller tile.
_INTERPRETER_CONFIG = {"BLOCK_N": 32, "BLOCK_K": 64}


def _launch(
    m_tiles: int,
    n: int,
    k: int,
    out: torch.Tensor,
    xe,
    xo,
    xg,
    x_rows,
    w_codes,
    w_scales,
    wg,
    tiles,
    rows,
    num_warps: int,
    **constexprs,
):
    """Run the kernel into ``out`` ``[rows, n]``, through a float32 split-K workspace when K is split."""
    cuda = xe.is_cuda
    block_n = BLOCK_N if cuda else _INTERPRETER_CONFIG["BLOCK_N"]
    split = split_k(triton.cdiv(n, block_n), k, xe.device)
    target = out if split == 1 else torch.empty((split, rows, n), dtype=torch.float32, device=out.device)
    args = (xe, xo, xg, x_rows, w_codes, w_scales, wg, target, *tiles, rows, n, k)
    grid = (m_tiles, triton.cdiv(n, block_n), split)
    if cuda:
        nvfp4_gemm_kernel[grid](
            *args, **constexprs, SPLIT_K=split, **_CUDA_CONFIG, num_warps=num_warps, DOT_DTYPE=tl.float16,
            enable_fp_fusion=False,
        )  # fmt: skip
    else:
        nvfp4_gemm_kernel[grid](*args, **constexprs, SPLIT_K=split, **_INTERPRETER_CONFIG, DOT_DTYPE=tl.float32)
    if split > 1:
        out.copy_(sum_in_split_order(target))


def _decoded_activations(qx: NVFP4Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations decoded once to ``dtype`` without their global scale (exact in bf16 and float16) and the
    per-row scales ``[M]``."""
    m = qx.shape[0]
    g = qx.global_scale.reshape(-1).to(torch.float32)
    if g.numel() == 1 and m != 1:
        g = g.expand(m).contiguous()
    return dequantize(_unscaled(qx), dtype), g


def _planes(qx: NVFP4Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The packed kernel's activation operands: even and odd elements ``[M, K / 2]`` (float16 on GPUs,
    float32 in the interpreter) and the per-row global scales ``[M]``."""
    xd, g = _decoded_activations(qx, torch.float16 if qx.codes.is_cuda else torch.float32)
    return xd[:, 0::2].contiguous(), xd[:, 1::2].contiguous(), g


def _flat(t: NVFP4Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    k = t.shape[-1]
    return t.codes.reshape(-1, k // 2).contiguous(), t.block_scales.reshape(-1, k // NVFP4_BLOCK).contiguous().view(
        torch.uint8
    )


def _unscaled(t: NVFP4Tensor) -> NVFP4Tensor:
    """The same codes and block scales with unit global scales (decoded exactly in bf16)."""
    ones = torch.ones_like(t.global_scale, dtype=torch.float32)
    return NVFP4Tensor(t.codes, t.block_scales, ones, t.four_over_six, t.shape)


def matmul(qx: NVFP4Tensor, qw: NVFP4Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """``dequantize(qx) @ dequantize(qw).T`` with float32 accumulation.

    Args:
        qx: activations ``[M, K]`` quantised per token (global scale ``[M]``) or per tensor (``[]``).
        qw: weight ``[N, K]`` quantised per tensor (global scale ``[]``).
        out_dtype: dtype of the result ``[M, N]``.
    Operands are validated by :func:`nibble.kernels.gemm.matmul`.
    """
    return packed_matmul(qx, qw, out_dtype)


def packed_matmul(
    qx: NVFP4Tensor, qw: NVFP4Tensor, out_dtype: torch.dtype, tile: tuple[int, int] | None = None
) -> torch.Tensor:
    """:func:`matmul` through the packed Triton GEMM; each row's result is independent of the row count.
    ``tile``: ``(BLOCK_M, num_warps)``, by default :func:`row_tile` of M (benchmarks choose their own)."""
    m, k = qx.shape
    n = qw.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=qx.device)
    if m == 0:
        return out
    xe, xo, xg = _planes(qx)
    block_m, num_warps = tile or row_tile(m, qx.device)
    w_codes, w_scales = _flat(qw)
    wg = qw.global_scale.reshape(1).to(torch.float32)
    unused = xg  # the grouped-only pointers
    _launch(
        triton.cdiv(m, block_m), n, k, out, xe, xo, xg, unused, w_codes, w_scales, wg, (unused,) * 4, m, num_warps,
        GROUPED=False, GATHER_X=False, BLOCK_M=block_m,
    )  # fmt: skip
    return out


def dequantized_matmul(qx: NVFP4Tensor, qw: NVFP4Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """:func:`matmul` by decoding both operands (exactly, in bf16, global scales applied after) and calling
    the vendor GEMM with float32 output (its summation order depends on the row count: benchmarks only)."""
    x = dequantize(_unscaled(qx), torch.bfloat16)
    w = dequantize(_unscaled(qw), torch.bfloat16)
    y = torch.mm(x, w.t(), out_dtype=torch.float32)
    xg = qx.global_scale.to(torch.float32).reshape(-1, 1) if qx.global_scale.dim() else qx.global_scale
    return ((y * xg) * qw.global_scale.to(torch.float32)).to(out_dtype)


def grouped_matmul(
    qx: NVFP4Tensor,
    qw: NVFP4Tensor,
    experts: torch.Tensor,
    x_rows: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """Per-row expert GEMM in one launch: ``out[r] = dequantize(qx)[x_rows[r]] @ dequantize(qw[experts[r]]).T``.

    Args:
        qx: activations ``[T, K]`` quantised per token.
        qw: expert stack ``[E, N, K]`` with one global scale per expert (``[E]``).
        experts: int64 ``[R]`` expert of each output row, sorted ascending (rows grouped by expert).
        x_rows: int64 ``[R]`` activation row feeding each output row, or ``None`` for ``R == T`` in order.
        out_dtype: dtype of the result ``[R, N]``.
    Operands are validated by :func:`nibble.kernels.gemm.grouped_matmul`.
    """
    k = qx.shape[1]
    num_experts, n = qw.shape[0], qw.shape[1]
    r = experts.shape[0]
    out = torch.empty((r, n), dtype=out_dtype, device=qx.device)
    if r == 0:
        return out
    block_m, num_warps = row_tile(r / num_experts, qx.device)
    tile_expert, tile_start, tile_end, num_tiles, max_tiles = _tiles(experts, num_experts, block_m)
    xe, xo, xg = _planes(qx)
    w_codes, w_scales = _flat(qw)
    gather = x_rows is not None
    rows_index = x_rows if gather else tile_start
    wg = qw.global_scale.to(torch.float32).contiguous()
    _launch(
        max_tiles, n, k, out, xe, xo, xg, rows_index, w_codes, w_scales, wg,
        (tile_expert, tile_start, tile_end, num_tiles), r, num_warps,
        GROUPED=True, GATHER_X=gather, BLOCK_M=block_m,
    )  # fmt: skip
    return out


def _tiles(experts: torch.Tensor, num_experts: int, block_m: int):
    """Row tiles of expert-sorted rows, built on the device: each tile lies inside one expert's rows.

    Returns ``(tile_expert, tile_start, tile_end, num_tiles, max_tiles)``: int32 ``[max_tiles]`` arrays, the
    real tile count as a 1-element device tensor and its host-side upper bound (the launch grid).
    """
    r = experts.shape[0]
    counts = grouped.expert_counts(experts, num_experts)
    tiles = (counts + block_m - 1) // block_m
    tile_cum = torch.cumsum(tiles, 0)
    row_first = torch.cumsum(counts, 0) - counts
    max_tiles = triton.cdiv(r, block_m) + num_experts
    index = torch.arange(max_tiles, device=experts.device)
    expert = torch.searchsorted(tile_cum, index, right=True).clamp(max=num_experts - 1)
    local = index - (tile_cum - tiles)[expert]
    start = row_first[expert] + local * block_m
    end = row_first[expert] + counts[expert]
    return expert.to(torch.int32), start.to(torch.int32), end.to(torch.int32), tile_cum[-1:].to(torch.int32), max_tiles
