"""Triton NVFP4 × NVFP4 GEMM (emulated W4A4) for dense and grouped (MoE) linear layers.

Weights stay packed in memory (0.5 byte per element plus one E4M3 byte per 16) and are decoded in
registers; activations (small at decode) arrive decoded once, without their global scale, split into
their even and odd elements. Every decoded value is exact in float16: an activation is
``e2m1_value(code) * block_scale`` (at most 6 significant bits, between 2^-10 and 2688) and a weight is
that times 2^-14 (a multiple of 2^-24, at most 0.17), so the tensor-core products are exact and only the
float32 accumulation order differs from ``dequantize(x̂) @ dequantize(Ŵ).T``. The 2^14 and the global
scales (per token for activations, per tensor or per expert for weights) multiply the float32
accumulator once at the end. On Hopper this moves a quarter of the bf16 weight bytes, which is the whole
win for decode (memory-bound); Blackwell's FP4 tensor cores would consume the same codes and scales
directly.

A packed byte holds elements ``2j`` (low nibble) and ``2j + 1`` (high nibble), so the kernel never
interleaves them: it contracts the even elements against the low nibbles and the odd elements against
the high nibbles (two products into one accumulator); both nibbles of a byte share one block scale,
decoded once. A nibble becomes a float16 by placing its three magnitude bits under the float16
exponent (``(c & 7) << 9``, a float16 subnormal for magnitude 1) and its sign bit on the sign: that
float16 is exactly ``e2m1_value(c) * 2^-14``. Weight tiles are loaded K-major (``[BLOCK_K / 2, BLOCK_N]``),
the layout the tensor-core operand wants, with no reshapes.

At decode sizes a row tile times the weight's column tiles gives too few programs to keep the GPU's
memory system busy, so K may be split over ``SPLIT_K`` programs, each writing float32 partial sums to its
own slice of a workspace that one deterministic sum reduces (no atomics: the same inputs give the same
bits).

The grouped form runs every expert of a layer in one launch: rows are sorted by expert and each
program's row tile belongs to one expert (tile metadata built on the device, so the launch needs no
host synchronisation and can be captured in a CUDA graph).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .nvfp4_quantize import e4m3_decode


@triton.jit
def _e2m1_f16(nibble):
    """float16 ``e2m1_value * 2^-14`` of the E2M1 code in the low 4 bits of int32 ``nibble``."""
    return (((nibble & 7) << 9) | ((nibble & 8) << 12)).to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def nvfp4_gemm_kernel(
    x_even_ptr,
    x_odd_ptr,
    x_g_ptr,
    x_rows_ptr,
    w_codes_ptr,
    w_scales_ptr,
    w_g_ptr,
    out_ptr,
    tile_expert_ptr,
    tile_start_ptr,
    tile_end_ptr,
    num_tiles_ptr,
    M,
    N,
    K: tl.constexpr,
    GROUPED: tl.constexpr,
    GATHER_X: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    """``out[r, n] = (Σ_k x[r, k] ŵ[n, k]) * gx[r] * gw`` with ``x`` decoded activations (even and odd
    elements ``[T, K / 2]`` each, without their global scale) and ``ŵ`` packed NVFP4 weights.

    Dense: rows ``r`` in ``[0, M)``; weights ``[N, K]`` with one global scale. Grouped: program ``pid_m``
    handles tile ``pid_m`` of the expert-sorted rows ``[tile_start, tile_end)`` against expert
    ``tile_expert``'s weights (``[E, N, K]``, one global scale per expert); programs past the device-side
    tile count exit. ``GATHER_X`` reads activation row ``x_rows[r]`` for output row ``r`` (one token
    feeding its k experts without a copy). With ``SPLIT_K`` > 1 program ``pid_k`` sums its share of K into
    float32 slice ``pid_k`` of ``out`` (``[SPLIT_K, M, N]``). ``DOT_DTYPE`` is float16 on GPUs (tensor
    cores); the Triton interpreter, whose half-precision dot products are not faithful, multiplies in
    float32.
    """
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    if GROUPED:
        if pid_m >= tl.load(num_tiles_ptr):
            return
        expert = tl.load(tile_expert_ptr + pid_m).to(tl.int64)
        row_start = tl.load(tile_start_ptr + pid_m)
        row_end = tl.load(tile_end_ptr + pid_m)
    else:
        expert = 0
        row_start = pid_m * BLOCK_M
        row_end = M
    rows = row_start + tl.arange(0, BLOCK_M)
    row_ok = rows < row_end
    rows = tl.where(row_ok, rows, 0).to(tl.int64)
    if GATHER_X:
        x_rows = tl.load(x_rows_ptr + rows, mask=row_ok, other=0).to(tl.int64)
    else:
        x_rows = rows
    cols = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    col_ok = cols < N
    w_rows = expert * N + tl.where(col_ok, cols, 0)

    HALF: tl.constexpr = BLOCK_K // 2
    PAIRS: tl.constexpr = K // 2
    CHUNK: tl.constexpr = (K + SPLIT_K * BLOCK_K - 1) // (SPLIT_K * BLOCK_K) * HALF  # packed bytes per split
    pairs = tl.arange(0, HALF)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in tl.range(0, CHUNK, HALF):
        p = pid_k * CHUNK + step + pairs  # packed column = pair of elements 2p, 2p + 1
        p_ok = p < PAIRS
        x_offs = x_rows[:, None] * PAIRS + p[None, :]
        x_mask = row_ok[:, None] & p_ok[None, :]
        x_even = tl.load(x_even_ptr + x_offs, mask=x_mask, other=0.0)
        x_odd = tl.load(x_odd_ptr + x_offs, mask=x_mask, other=0.0)
        w_mask = p_ok[:, None] & col_ok[None, :]
        packed = tl.load(w_codes_ptr + w_rows[None, :] * PAIRS + p[:, None], mask=w_mask, other=0).to(tl.int32)
        scale_byte = tl.load(w_scales_ptr + w_rows[None, :] * (K // 16) + (p // 8)[:, None], mask=w_mask, other=0)
        scale = e4m3_decode(scale_byte).to(tl.float16)  # exact: every E4M3 value is a float16
        w_low = (_e2m1_f16(packed) * scale).to(DOT_DTYPE)
        w_high = (_e2m1_f16(packed >> 4) * scale).to(DOT_DTYPE)
        acc = tl.dot(x_even, w_low, acc)
        acc = tl.dot(x_odd, w_high, acc)

    gx = tl.load(x_g_ptr + x_rows, mask=row_ok, other=0.0)
    gw = tl.load(w_g_ptr + expert)
    y = ((acc * 16384.0) * gx[:, None]) * gw  # 2^14: the weights' decoding offset, exact
    out_offs = rows[:, None] * N + cols[None, :]
    out_mask = row_ok[:, None] & col_ok[None, :]
    if SPLIT_K == 1:
        tl.store(out_ptr + out_offs, y.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        tl.store(out_ptr + pid_k.to(tl.int64) * M * N + out_offs, y, mask=out_mask)
