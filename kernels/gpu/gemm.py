"""Launchers for the Triton NVFP4 GEMM: dense ``x @ W.T`` and grouped (one launch per MoE layer)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..tensors import NVFP4_BLOCK, NVFP4Tensor
from . import grouped
from .nvfp4 import dequantize
from .nvfp4_gemm import nvfp4_gemm_kernel, split_sum_kernel
from .row_invariance import row_tile, split_k


@dataclass(frozen=True)
class Variant:
    """One compiled form of the packed GEMM: weight rows per program (``block_n``, which also sets the split
    of K), K per step (``block_k``), software-pipeline depth, the nibble decoder (inline PTX or pure Triton)
    and a floor on the warps per program. ``block_n`` and ``block_k`` set a row's summation order; the
    others should not (the GPU tests and the benchmark check each variant's rows across row counts)."""

    block_n: int
    block_k: int
    stages: int
    asm: bool
    warps: int | None = None  # at least this many warps per program (the row tile's otherwise)
    planar_from: int | None = None  # from this many rows per weight matrix, activations copied planar

    @property
    def name(self) -> str:
        warps = f"_w{self.warps}" if self.warps else ""
        planar = f"_p{self.planar_from}" if self.planar_from else ""
        return f"n{self.block_n}_k{self.block_k}_s{self.stages}{warps}{planar}_{'asm' if self.asm else 'triton'}"


# Row invariance (:mod:`.row_invariance`): a weight shape always runs one variant, whatever the row count;
# only the row tile follows M. VARIANTS are what benchmarks/nvfp4_gemm_fast_gpu.py measures; SHAPE_VARIANT
# ((N, K) -> variant, the fastest there at M <= 32 among those with bit-identical rows at every M) is filled
# from its results; other shapes run DEFAULT_VARIANT, which decodes in pure Triton until the H200 shows the
# inline-PTX decode (same bits) compiles and wins there. The dequantise-and-vendor-GEMM form below stays for
# benchmarks/kernels_gpu.py to measure against.
VARIANTS = (
    Variant(64, 128, 4, True),
    Variant(128, 128, 4, True),
    Variant(128, 128, 4, False),  # the pure-Triton decode, for the price of the inline PTX
    Variant(64, 256, 3, True),  # 4 stages of 256 overflow shared memory at BLOCK_M 128
    Variant(128, 128, 3, True),
    Variant(128, 128, 4, True, warps=8),  # two warpgroups share the weight rows at every row count
    Variant(128, 128, 4, True, planar_from=128),  # the activation copy pays off with many rows (same bits)
)
DEFAULT_VARIANT = Variant(128, 128, 4, False)
SHAPE_VARIANT: dict[tuple[int, int], Variant] = {}
# The Triton interpreter (CPU tests) runs a smaller tile and the pure-Triton decode.
INTERPRETER_VARIANT = Variant(32, 64, 1, False)


def variant_for(n: int, k: int, device: torch.device) -> Variant:
    """The variant a weight ``[.., n, k]`` runs on ``device`` (:data:`SHAPE_VARIANT`, else the default)."""
    if device.type != "cuda":
        return INTERPRETER_VARIANT
    return SHAPE_VARIANT.get((n, k), DEFAULT_VARIANT)


def _launch(
    m_tiles: int,
    n: int,
    k: int,
    out: torch.Tensor,
    x,
    xg,
    x_rows,
    w_codes,
    w_scales,
    wg,
    tiles,
    rows,
    num_warps: int,
    v: Variant,
    **constexprs,
):
    """Run the kernel into ``out`` ``[rows, n]``, through a float32 split-K workspace when K is split.
    ``x``: the activations as :func:`_operand` laid them out for ``v``."""
    cuda = x.is_cuda
    split = split_k(triton.cdiv(n, v.block_n), k, x.device)
    target = out if split == 1 else torch.empty((split, rows, n), dtype=torch.float32, device=out.device)
    planar = x.dim() == 3
    args = (x, xg, x_rows, w_codes, w_scales, wg, target, *tiles, x[0].numel() if planar else 0, rows, n, k)
    grid = (m_tiles, triton.cdiv(n, v.block_n), split)
    tiling = {"BLOCK_N": v.block_n, "BLOCK_K": v.block_k, "ASM_DECODE": v.asm, "X_PLANAR": planar}
    if cuda:
        nvfp4_gemm_kernel[grid](
            *args, **constexprs, SPLIT_K=split, **tiling, num_stages=v.stages, num_warps=max(num_warps, v.warps or 0),
            DOT_DTYPE=tl.float16, enable_fp_fusion=False,
        )  # fmt: skip
    else:
        nvfp4_gemm_kernel[grid](*args, **constexprs, SPLIT_K=split, **tiling, DOT_DTYPE=tl.float32)
    if split > 1:
        # the interpreter's float32 -> 16-bit casts do not round to nearest even: sum in float32 there
        total = out if cuda or out.dtype == torch.float32 else torch.empty_like(out, dtype=torch.float32)
        numel = rows * n
        split_sum_kernel[(triton.cdiv(numel, 1024),)](target, total, numel, SPLIT_K=split, BLOCK=1024)
        if total is not out:
            out.copy_(total)


def _decoded_activations(qx: NVFP4Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations decoded once to ``dtype`` without their global scale (exact in bf16 and float16) and the
    per-row scales ``[M]``."""
    m = qx.shape[0]
    g = qx.global_scale.reshape(-1).to(torch.float32)
    if g.numel() == 1 and m != 1:
        g = g.expand(m).contiguous()
    return dequantize(_unscaled(qx), dtype), g


def _resolve(variant: Variant | None, n: int, k: int, device: torch.device) -> Variant:
    v = variant or variant_for(n, k, device)
    if v.asm and device.type != "cuda":
        raise ValueError("the inline-PTX decode runs on CUDA only (the Triton interpreter cannot run PTX)")
    return v


def _operand(qx: NVFP4Tensor, v: Variant, rows_per_matrix: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The packed kernel's activation operand (float16 on GPUs, float32 in the interpreter) and the per-row
    global scales ``[M]``. The operand is the decoded ``[M, K]``, whose even and odd elements the kernel
    reads in place, or from ``v.planar_from`` rows per weight matrix on, two planes ``[2, M, K' / 2]``
    (even, odd elements; K zero-padded to a multiple of ``v.block_k``) in the kernel's contraction order
    (``nvfp4_gemm._mma_order``), which it loads as contiguous rows: the same values at the same contraction
    positions, so the same bits, for one copy."""
    x, g = _decoded_activations(qx, torch.float16 if qx.codes.is_cuda else torch.float32)
    if v.planar_from is None or rows_per_matrix < v.planar_from:
        return x, g
    t, k = x.shape
    padded = triton.cdiv(k, v.block_k) * v.block_k
    if padded != k:
        x = torch.nn.functional.pad(x, (0, padded - k))
    # element 2 * (t'*4C + c*4 + h*2 + e) + parity of each step, C = block_k / 32, to plane parity at
    # position c*16 + h*8 + t'*2 + e
    steps = x.view(t, padded // v.block_k, 4, v.block_k // 32, 2, 2, 2)
    return steps.permute(6, 0, 1, 3, 4, 2, 5).reshape(2, t, padded // 2), g


def _flat(t: NVFP4Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    k = t.shape[-1]
    return t.codes.reshape(-1, k // 2).contiguous(), t.block_scales.reshape(-1, k // NVFP4_BLOCK).contiguous().view(
        torch.uint8
    )


_UNIT_SCALE: dict[torch.device, torch.Tensor] = {}


def _unscaled(t: NVFP4Tensor) -> NVFP4Tensor:
    """The same codes and block scales with a unit global scale (decoded exactly in bf16)."""
    one = _UNIT_SCALE.get(t.codes.device)
    if one is None:
        one = torch.ones((), dtype=torch.float32, device=t.codes.device)
        # one fill kernel less per product; never cache a tensor that a graph being captured would fill
        if not (t.codes.is_cuda and torch.cuda.is_current_stream_capturing()):
            _UNIT_SCALE[t.codes.device] = one
    return NVFP4Tensor(t.codes, t.block_scales, one, t.four_over_six, t.shape)


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
    qx: NVFP4Tensor,
    qw: NVFP4Tensor,
    out_dtype: torch.dtype,
    tile: tuple[int, int] | None = None,
    variant: Variant | None = None,
) -> torch.Tensor:
    """:func:`matmul` through the packed Triton GEMM; each row's result is independent of the row count.
    ``tile``: ``(BLOCK_M, num_warps)``, by default :func:`row_tile` of M; ``variant``: by default
    :func:`variant_for` the weight's shape (benchmarks and tests choose their own)."""
    m, k = qx.shape
    n = qw.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=qx.device)
    if m == 0:
        return out
    v = _resolve(variant, n, k, qx.device)
    x, xg = _operand(qx, v, m)
    block_m, num_warps = tile or row_tile(m, qx.device)
    w_codes, w_scales = _flat(qw)
    wg = qw.global_scale.reshape(1).to(torch.float32)
    unused = xg  # the grouped-only pointers
    _launch(
        triton.cdiv(m, block_m), n, k, out, x, xg, unused, w_codes, w_scales, wg, (unused,) * 4, m, num_warps,
        v, GROUPED=False, GATHER_X=False, BLOCK_M=block_m,
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
    v = _resolve(None, n, k, qx.device)
    x, xg = _operand(qx, v, r / num_experts)
    w_codes, w_scales = _flat(qw)
    gather = x_rows is not None
    rows_index = x_rows if gather else tile_start
    wg = qw.global_scale.to(torch.float32).contiguous()
    _launch(
        max_tiles, n, k, out, x, xg, rows_index, w_codes, w_scales, wg,
        (tile_expert, tile_start, tile_end, num_tiles), r, num_warps, v,
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
