"""Triton NVFP4 × NVFP4 GEMM (emulated W4A4) for dense and grouped (MoE) linear layers.

Weights stay packed in memory (0.5 byte per element plus one E4M3 byte per 16) and are decoded in
registers; activations (small at decode) arrive decoded once, without their global scale. Every decoded
value ``e2m1_value(code) * float(block_scale)`` is exact in bfloat16 (a 2-bit by a 4-bit significand),
so the tensor-core products are exact and only the float32 accumulation order differs from
``dequantize(x̂) @ dequantize(Ŵ).T``. The global scales (per token for activations, per tensor or per
expert for weights) multiply the float32 accumulator once at the end. On Hopper this moves a quarter
of the bf16 weight bytes, which is the whole win for decode (memory-bound); Blackwell's FP4 tensor cores
would consume the same codes and scales directly.

A packed byte holds elements ``2j`` (low nibble) and ``2j + 1`` (high nibble), so the kernel never
interleaves them: it contracts the even elements against the low nibbles and the odd elements against
the high nibbles (two products into one accumulator). A nibble becomes a float16 by placing its three
magnitude bits under the float16 exponent (``(c & 7) << 9``, a float16 subnormal for magnitude 1) and its
sign bit on the sign: that float16 is exactly ``e2m1_value(c) * 2^-14``; the ``2^14`` is folded into the
block scale.

The grouped form runs every expert of a layer in one launch: rows are sorted by expert and each
program's row tile belongs to one expert (tile metadata built on the device, so the launch needs no
host synchronisation and can be captured in a CUDA graph).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .nvfp4_quantize import e4m3_decode


@triton.jit
def _nibbles_f32(low_bits, sign_bits):
    """float32 ``e2m1_value * 2^-14`` from float16 bit fields already in place (int32 tensors)."""
    return (low_bits | sign_bits).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def nvfp4_gemm_kernel(
    x_ptr,
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
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    """``out[r, n] = (Σ_k x[r, k] ŵ[n, k]) * gx[r] * gw`` with ``x`` decoded activations ``[T, K]`` (in
    ``DOT_DTYPE``, without their global scale) and ``ŵ`` packed NVFP4 weights.

    Dense: rows ``r`` in ``[0, M)``; weights ``[N, K]`` with one global scale. Grouped: program ``pid_m``
    handles tile ``pid_m`` of the expert-sorted rows ``[tile_start, tile_end)`` against expert
    ``tile_expert``'s weights (``[E, N, K]``, one global scale per expert); programs past the device-side
    tile count exit. ``GATHER_X`` reads activation row ``x_rows[r]`` for output row ``r`` (one token
    feeding its k experts without a copy). ``DOT_DTYPE`` is bfloat16 on GPUs (tensor cores); the Triton
    interpreter, whose bfloat16 arithmetic is not faithful, multiplies in float32.
    """
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
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

    half: tl.constexpr = BLOCK_K // 2
    nbk: tl.constexpr = BLOCK_K // 16
    pairs = tl.arange(0, half)
    blocks = tl.arange(0, nbk)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K):
        k_ok = (k0 + 2 * pairs) < K
        x_base = x_ptr + x_rows[:, None] * K + k0 + 2 * pairs[None, :]
        x_mask = row_ok[:, None] & k_ok[None, :]
        x_even = tl.load(x_base, mask=x_mask, other=0.0)
        x_odd = tl.load(x_base + 1, mask=x_mask, other=0.0)

        w_mask = col_ok[:, None] & k_ok[None, :]
        packed = tl.load(w_codes_ptr + w_rows[:, None] * (K // 2) + k0 // 2 + pairs[None, :], mask=w_mask, other=0)
        packed = packed.to(tl.int32)
        b_mask = col_ok[:, None] & ((k0 // 16 + blocks) < K // 16)[None, :]
        scale_bytes = tl.load(
            w_scales_ptr + w_rows[:, None] * (K // 16) + k0 // 16 + blocks[None, :], mask=b_mask, other=0
        )
        scale = (e4m3_decode(scale_bytes) * 16384.0)[:, :, None]  # folds the nibbles' 2^-14
        low = _nibbles_f32((packed & 7) << 9, (packed & 8) << 12)
        high = _nibbles_f32((packed & 0x70) << 5, (packed & 0x80) << 8)
        w_low = tl.reshape(tl.reshape(low, (BLOCK_N, nbk, 8)) * scale, (BLOCK_N, half)).to(DOT_DTYPE)
        w_high = tl.reshape(tl.reshape(high, (BLOCK_N, nbk, 8)) * scale, (BLOCK_N, half)).to(DOT_DTYPE)
        acc = tl.dot(x_even, tl.trans(w_low), acc)
        acc = tl.dot(x_odd, tl.trans(w_high), acc)

    gx = tl.load(x_g_ptr + x_rows, mask=row_ok, other=0.0)
    gw = tl.load(w_g_ptr + expert)
    y = (acc * gx[:, None]) * gw
    out_offs = rows[:, None] * N + cols[None, :]
    tl.store(out_ptr + out_offs, y.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])
