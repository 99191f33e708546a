"""Launchers for the NVFP4 GEMMs: dense ``x @ W.T`` and grouped (one launch per MoE layer).

Three kernels compute the block-ordered sum of docs/design.md §2.6 and so give every row the same bits: on CUDA the
fragment kernels of :mod:`.fragment_gemm` — ``gemv`` up to a measured number of rows per weight matrix
(:func:`dense_gemv`, :data:`GROUPED_CROSSOVER_ROWS`), ``gemm`` beyond — on weights in the fragment layout
(a sampler's packed weights carry it; other weights, the trainer's quantised-per-forward ones, are rearranged on the
way in); the packed Triton kernel (:mod:`.nvfp4_gemm`) where those do not compile, and in the CPU test suite through
Triton's interpreter.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ..fragments import NVFP4Fragments, mismatch, to_fragments
from ..tensors import NVFP4_BLOCK, NVFP4Tensor
from . import fragment_gemm
from .expert_tiles import expert_tiles
from .nvfp4 import dequantize
from .nvfp4_gemm import nvfp4_gemm_kernel
from .row_invariance import row_tile

# Which CUDA kernel a product takes (speed only: both give the same bits), measured by benchmarks/gemm_backends_gpu.py
# on the H100 (benchmarks/results/h100_gemm_backends.json: "crossover_rows" per shape, the rows up to which gemv won,
# 32 / 64 / 256 on 8192 x 7168 / 4096 x 4096 / 1536 x 2048, which dense_gemv reproduces: "dispatch_crossover_rows").
# Dense products: gemv up to DENSE_GEMV_ROWS[0] rows, gemm beyond DENSE_GEMV_ROWS[1]; between, gemv wherever gemm's
# tile launches fewer than fragment_gemm.MIN_GEMM_CTAS CTAs, which leaves SMs idle (4096 x 4096 at M = 64: 64 CTAs,
# 34.1 against gemv's 20.6 us; at 96, 128 CTAs, 34.4 against 35.1), whatever K (a narrow weight with a long K, such
# as a 4096 x 14336 down projection, launches as few CTAs as 4096 x 4096 and more work in each).
DENSE_GEMV_ROWS = (32, 256)
# Grouped products: gemv up to this many rows per expert (16: 208.4 against gemm's 216.8 us, 32: 360.0 against 224.6).
GROUPED_CROSSOVER_ROWS = 16
BLOCK_N = 64
# The Triton interpreter (CPU tests) runs a smaller tile.
_INTERPRETER_BLOCK_N = 32
_CUDA_OUT = (torch.float32, torch.bfloat16)


def _launch_triton(
    m_tiles: int, n: int, k: int, out: torch.Tensor, x, xg, x_rows, w_codes, w_scales, wg, tiles, num_warps, **flags
):
    """Run the Triton kernel into ``out`` ``[rows, n]``."""
    cuda = x.is_cuda
    block_n = BLOCK_N if cuda else _INTERPRETER_BLOCK_N
    grid = (m_tiles, triton.cdiv(n, block_n))
    args = (x, xg, x_rows, w_codes, w_scales, wg, out, *tiles, out.shape[0], n, k)
    if cuda:
        nvfp4_gemm_kernel[grid](
            *args, **flags, BLOCK_N=block_n, num_warps=num_warps, num_stages=3, DOT_DTYPE=tl.float16,
            enable_fp_fusion=False,
        )  # fmt: skip
    else:
        nvfp4_gemm_kernel[grid](*args, **flags, BLOCK_N=block_n, DOT_DTYPE=tl.float32)


def _activations(qx: NVFP4Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernels' activation operand ``[M, K]``, decoded once without its global scale (exact in float16; float32
    in the interpreter) — the one the quantise kernel wrote beside the codes if it did (:attr:`NVFP4Tensor.operand`)
    — and the per-row global scales ``[M]``.

    Raises:
        ValueError: ``qx.operand`` is not ``[M, K]`` in the dtype the kernels read on ``qx``'s device.
    """
    m = qx.shape[0]
    g = qx.global_scale.reshape(-1).to(torch.float32)
    if g.numel() == 1 and m != 1:
        g = g.expand(m).contiguous()
    dtype = torch.float16 if qx.codes.is_cuda else torch.float32
    if qx.operand is None:
        return dequantize(qx.unscaled(), dtype), g
    if qx.operand.dtype != dtype or tuple(qx.operand.shape) != tuple(qx.shape) or qx.operand.device != qx.device:
        raise ValueError(
            f"NVFP4 GEMM: activation operand {qx.operand.dtype} {tuple(qx.operand.shape)} on {qx.operand.device} "
            f"is not the {dtype} {tuple(qx.shape)} on {qx.device} the kernels read"
        )
    return qx.operand.contiguous(), g


def _flat(t: NVFP4Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    k = t.shape[-1]
    return t.codes.reshape(-1, k // 2).contiguous(), t.block_scales.reshape(-1, k // NVFP4_BLOCK).contiguous().view(
        torch.uint8
    )


def _fragments(qw: NVFP4Tensor) -> NVFP4Fragments:
    """``qw``'s fragment layout, made on the way in when it carries none.

    Raises:
        ValueError: the fragments it carries are not the layout of its codes (another shape or device).
    """
    if qw.fragments is None:
        return to_fragments(qw.codes, qw.block_scales)
    why = mismatch(qw.fragments, qw.codes, qw.block_scales)
    if why is not None:
        raise ValueError(f"NVFP4 GEMM: {why}")
    return qw.fragments


def cuda_kernels(device: torch.device) -> bool:
    """Whether the fragment kernels serve NVFP4 products on ``device``."""
    return device.type == "cuda" and fragment_gemm.available(
        device.index if device.index is not None else torch.cuda.current_device()
    )


def dense_gemv(m: int, n: int, shared_bytes: int) -> bool:
    """Whether gemv (rather than gemm) serves a dense product of ``m`` rows with an ``[n, K]`` weight on a GPU whose
    CTAs may take ``shared_bytes`` of shared memory (:func:`fragment_gemm.shared_limit`): the rule of
    :data:`DENSE_GEMV_ROWS`.

    Raises:
        ValueError: a negative row count, or a weight without columns.
    """
    if m < 0 or n < 1:
        raise ValueError(f"dense NVFP4 product of {m} rows with a weight of {n} columns: no kernel to choose")
    fewest, most = DENSE_GEMV_ROWS
    if m <= fewest or m > most:
        return m <= fewest
    row_tiles, groups = -(-m // fragment_gemm.GEMM_ROWS), -(-n // 16)
    tile = fragment_gemm.gemm_tile(row_tiles, groups, shared_bytes)
    return fragment_gemm.gemm_ctas(row_tiles, groups, tile) < fragment_gemm.MIN_GEMM_CTAS


def matmul(qx: NVFP4Tensor, qw: NVFP4Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """``dequantize(qx) @ dequantize(qw).T``, block-ordered (docs/design.md §2.6).

    Args:
        qx: activations ``[M, K]`` quantised per token (global scale ``[M]``) or per tensor (``[]``).
        qw: weight ``[N, K]`` quantised per tensor (global scale ``[]``).
        out_dtype: dtype of the result ``[M, N]``.
    Operands are validated by :func:`nibble.kernels.gemm.matmul`.
    """
    if cuda_kernels(qx.device):
        return fragment_matmul(qx, qw, out_dtype)
    return packed_matmul(qx, qw, out_dtype)


def fragment_matmul(
    qx: NVFP4Tensor,
    qw: NVFP4Tensor,
    out_dtype: torch.dtype,
    gemv: bool | None = None,
    tile: fragment_gemm.GemvTile | fragment_gemm.GemmTile | None = None,
) -> torch.Tensor:
    """:func:`matmul` through the CUDA fragment kernels. ``gemv``: which kernel (default: :func:`dense_gemv`'s
    choice); ``tile``: a tile of that kernel other than its default (benchmarks choose their
    own)."""
    m = qx.shape[0]
    kernel_dtype = out_dtype if out_dtype in _CUDA_OUT else torch.float32
    out = torch.empty((m, qw.shape[0]), dtype=kernel_dtype, device=qx.device)
    if m:
        x, xg = _activations(qx)
        wg = qw.global_scale.reshape(1).to(torch.float32)
        if gemv is None:
            shared = fragment_gemm.shared_limit(qx.device)
            gemv = dense_gemv(m, qw.shape[0], shared) and fragment_gemm.gemv_fits(m, qx.shape[1], qx.device)
        fragment_gemm.launch(x, xg, _fragments(qw), wg, out, rows_per_matrix=m, gemv=gemv, tile=tile)
    return out.to(out_dtype)


@functools.cache
def _fragment_k_order(device: torch.device) -> torch.Tensor:
    """:data:`fragment_gemm.FRAGMENT_K_ORDER` on ``device``, made once (a CUDA graph cannot copy it in)."""
    return torch.tensor(fragment_gemm.FRAGMENT_K_ORDER, device=device)


def wgmma_matmul(
    qx: NVFP4Tensor,
    qw: NVFP4Tensor,
    out_dtype: torch.dtype,
    stages: int = fragment_gemm.WGMMA_STAGES,
    swizzle: int = 0,
) -> torch.Tensor:
    """:func:`matmul` through the warpgroup-MMA gemm (:func:`fragment_gemm.launch_wgmma`: Hopper; not dispatched).
    The activations are decoded as for the other kernels, then each block's elements permuted to the fragment
    layout's K order (one extra pass over ``[M, K]`` float16). ``swizzle``: how the kernel lays the activations in
    shared memory, one of ``fragment_gemm.WGMMA_SWIZZLES`` (a speed choice, meant to give the same bits: only 0 has
    run on a GPU).

    Raises:
        ValueError: from :func:`fragment_gemm.launch_wgmma` (a swizzle not among ``WGMMA_SWIZZLES`` before any work).
    """
    fragment_gemm.check_swizzle(swizzle)
    m, k = qx.shape
    kernel_dtype = out_dtype if out_dtype in _CUDA_OUT else torch.float32
    out = torch.empty((m, qw.shape[0]), dtype=kernel_dtype, device=qx.device)
    if m:
        x, xg = _activations(qx)
        x = x.view(m, k // NVFP4_BLOCK, NVFP4_BLOCK).index_select(2, _fragment_k_order(x.device)).reshape(m, k)
        wg = qw.global_scale.reshape(1).to(torch.float32)
        fragment_gemm.launch_wgmma(x, xg, _fragments(qw), wg, out, stages=stages, swizzle=swizzle)
    return out.to(out_dtype)


def packed_matmul(
    qx: NVFP4Tensor, qw: NVFP4Tensor, out_dtype: torch.dtype, tile: tuple[int, int] | None = None
) -> torch.Tensor:
    """:func:`matmul` through the packed Triton GEMM. ``tile``: ``(BLOCK_M, num_warps)``, by default
    :func:`row_tile` of M (a speed choice: every tile gives the same bits)."""
    m, k = qx.shape
    n = qw.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=qx.device)
    if m == 0:
        return out
    x, xg = _activations(qx)
    block_m, num_warps = tile or row_tile(m, qx.device)
    w_codes, w_scales = _flat(qw)
    wg = qw.global_scale.reshape(1).to(torch.float32)
    unused = xg  # the grouped-only pointers
    _launch_triton(
        triton.cdiv(m, block_m), n, k, out, x, xg, unused, w_codes, w_scales, wg, (unused,) * 4, num_warps,
        GROUPED=False, GATHER_X=False, BLOCK_M=block_m,
    )  # fmt: skip
    return out


def dequantized_matmul(qx: NVFP4Tensor, qw: NVFP4Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """:func:`matmul` by decoding both operands (exactly, in bf16, global scales applied after) and calling
    the vendor GEMM with float32 output (its summation order depends on the row count: benchmarks only)."""
    x = dequantize(qx.unscaled(), torch.bfloat16)
    w = dequantize(qw.unscaled(), torch.bfloat16)
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
    if cuda_kernels(qx.device):
        return fragment_grouped_matmul(qx, qw, experts, x_rows, out_dtype)
    return packed_grouped_matmul(qx, qw, experts, x_rows, out_dtype)


def fragment_grouped_matmul(
    qx: NVFP4Tensor,
    qw: NVFP4Tensor,
    experts: torch.Tensor,
    x_rows: torch.Tensor | None,
    out_dtype: torch.dtype,
    gemv: bool | None = None,
    tile: fragment_gemm.GemvTile | fragment_gemm.GemmTile | None = None,
) -> torch.Tensor:
    """:func:`grouped_matmul` through the CUDA fragment kernels (``gemv`` and ``tile`` as :func:`fragment_matmul`)."""
    num_experts, n = qw.shape[0], qw.shape[1]
    r = experts.shape[0]
    kernel_dtype = out_dtype if out_dtype in _CUDA_OUT else torch.float32
    out = torch.empty((r, n), dtype=kernel_dtype, device=qx.device)
    if r:
        x, xg = _activations(qx)
        wg = qw.global_scale.to(torch.float32).contiguous()
        per_expert = r / num_experts
        if gemv is None:
            gemv = per_expert <= GROUPED_CROSSOVER_ROWS and fragment_gemm.gemv_fits(per_expert, qx.shape[1], qx.device)
        rows = tile[0] if gemv and tile is not None else fragment_gemm.rows_per_cta(per_expert, gemv)
        tile_expert, tile_start, tile_end, num_tiles, max_tiles = expert_tiles(experts, num_experts, rows)
        fragment_gemm.launch(
            x, xg, _fragments(qw), wg, out, rows_per_matrix=per_expert, gemv=gemv, x_rows=x_rows,
            tiles=(tile_expert, tile_start, tile_end, num_tiles), grid_rows=max_tiles, tile=tile,
        )  # fmt: skip
    return out.to(out_dtype)


def packed_grouped_matmul(
    qx: NVFP4Tensor,
    qw: NVFP4Tensor,
    experts: torch.Tensor,
    x_rows: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """:func:`grouped_matmul` through the packed Triton GEMM."""
    k = qx.shape[1]
    num_experts, n = qw.shape[0], qw.shape[1]
    r = experts.shape[0]
    out = torch.empty((r, n), dtype=out_dtype, device=qx.device)
    if r == 0:
        return out
    x, xg = _activations(qx)
    wg = qw.global_scale.to(torch.float32).contiguous()
    block_m, num_warps = row_tile(r / num_experts, qx.device)
    tile_expert, tile_start, tile_end, num_tiles, max_tiles = expert_tiles(experts, num_experts, block_m)
    w_codes, w_scales = _flat(qw)
    gather = x_rows is not None
    rows_index = x_rows if gather else tile_start
    _launch_triton(
        max_tiles, n, k, out, x, xg, rows_index, w_codes, w_scales, wg,
        (tile_expert, tile_start, tile_end, num_tiles), num_warps,
        GROUPED=True, GATHER_X=gather, BLOCK_M=block_m,
    )  # fmt: skip
    return out
