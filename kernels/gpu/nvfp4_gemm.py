"""Triton NVFP4 × NVFP4 GEMM (emulated W4A4) for dense and grouped (MoE) linear layers, in the
block-ordered arithmetic of docs/design.md §2.6: the portable kernel (any GPU Triton runs on, and the CPU
through Triton's interpreter, where the test suite checks it), bit-identical to the CUDA kernels of
:mod:`.fragment_gemm`, which serve CUDA products where they compile.

Weights stay packed in memory (0.5 byte per element plus one E4M3 byte per 16) and are decoded in
registers; activations arrive decoded once, without their global scale (``e2m1_value × block_scale``, at
most 6 significant bits between 2^-10 and 2688: exact in float16). Each 16-element block ``b`` is one
``tl.dot`` with a zero accumulator: a weight nibble becomes the float16 ``e2m1_value × 2^-14`` by placing its
three magnitude bits under the float16 exponent (``(c & 7) << 9``) and its sign bit on the sign, so the
block's products and their sum are exact, and ``tl.fma(d, block_scale, acc)`` rounds once: ``acc + t_b``
in float32. (A plain ``acc + tl.dot(...)`` would be rewritten by Triton into the tensor core's own
accumulation, whose internal order is the hardware's.) Blocks add in order within chunks of
:data:`CHUNK_BLOCKS`, chunk sums in order, then the 2^14 and the global scales multiply.

A block's 16 products enter the dot in the order "low nibbles of its 8 bytes, then high nibbles"
(element ``2 (s mod 8) + s // 8`` in slot ``s``); the activations are read in that order too. The grouped
form runs every expert of a layer in one launch: rows are sorted by expert and each program's row tile
belongs to one expert (tile metadata built on the device, so the launch needs no host synchronisation and
can be captured in a CUDA graph). One dot per 16 elements keeps this kernel far slower than the CUDA ones
on large products: 227 µs at M = 1 and 1.96 ms at M = 256 on 8192 × 7168
(benchmarks/results/h200_block_ordered_first_run.json), where the CUDA gemv and gemm take 15.9 and 213 µs
(benchmarks/results/h200_gemm_backends.json).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..reference import block_gemm
from .nvfp4_quantize import e4m3_decode

# Blocks per chunk of the block-ordered sum (docs/design.md §2.6).
CHUNK_BLOCKS = tl.constexpr(block_gemm.CHUNK_BLOCKS)


@triton.jit
def _e2m1_f16(nibble):
    """float16 ``e2m1_value * 2^-14`` of the E2M1 code in the low 4 bits of int32 ``nibble``."""
    return (((nibble & 7) << 9) | ((nibble & 8) << 12)).to(tl.int16).to(tl.float16, bitcast=True)


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
    DOT_DTYPE: tl.constexpr,
):
    """``out[r, n] = ((Σ_chunks Σ_blocks t_b) · gx[r]) · gw`` with ``t_b`` the exact product of block ``b`` of
    decoded activations ``x [T, K]`` (without their global scale) and packed NVFP4 weights.

    Dense: rows ``r`` in ``[0, M)``; weights ``[N, K]`` with one global scale. Grouped: program ``pid_m``
    handles tile ``pid_m`` of the expert-sorted rows ``[tile_start, tile_end)`` against expert
    ``tile_expert``'s weights (``[E, N, K]``, one global scale per expert); programs past the device-side
    tile count exit. ``GATHER_X`` reads activation row ``x_rows[r]`` for output row ``r`` (one token
    feeding its k experts without a copy). ``DOT_DTYPE`` is float16 on GPUs (tensor cores); the Triton
    interpreter, whose half-precision dot products are not faithful, multiplies in float32 (exact too).
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

    BLOCKS: tl.constexpr = K // 16
    CHUNKS: tl.constexpr = (BLOCKS + CHUNK_BLOCKS - 1) // CHUNK_BLOCKS
    slot = tl.arange(0, 16)
    element = 2 * (slot % 8) + slot // 8  # slot s holds the low (s < 8) or high nibble of byte s mod 8
    shift = (slot // 8) * 4
    x_base = x_rows[:, None] * K + element[None, :]
    w_base = w_rows[None, :] * (K // 2) + (slot % 8)[:, None]
    x_mask = row_ok[:, None]
    w_mask = col_ok[None, :]
    total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for chunk in range(CHUNKS):
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for i in range(CHUNK_BLOCKS):
            b = chunk * CHUNK_BLOCKS + i
            ok = b < BLOCKS  # past K: zeros, which add +0 to a sum that is never -0
            x = tl.load(x_ptr + x_base + b * 16, mask=x_mask & ok, other=0.0).to(DOT_DTYPE)
            packed = tl.load(w_codes_ptr + w_base + b * 8, mask=w_mask & ok, other=0).to(tl.int32)
            w = _e2m1_f16((packed >> shift[:, None]) & 15).to(DOT_DTYPE)
            scale = e4m3_decode(tl.load(w_scales_ptr + w_rows * BLOCKS + b, mask=col_ok & ok, other=0))
            acc = tl.fma(tl.dot(x, w), scale[None, :], acc)
        total = total + acc

    gx = tl.load(x_g_ptr + x_rows, mask=row_ok, other=0.0)
    gw = tl.load(w_g_ptr + expert)
    y = ((total * 16384.0) * gx[:, None]) * gw  # 2^14: the weights' decoding offset, exact
    out_offs = rows[:, None] * N + cols[None, :]
    tl.store(out_ptr + out_offs, y.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])
