"""Triton NVFP4 × NVFP4 GEMM (emulated W4A4) for dense and grouped (MoE) linear layers.

Weights stay packed in memory (0.5 byte per element plus one E4M3 byte per 16) and are decoded in
registers; activations (small at decode) arrive decoded once, without their global scale. Every decoded
value is exact in float16: an activation is ``e2m1_value(code) * block_scale`` (at most 6 significant bits,
between 2^-10 and 2688) and a weight is that times 2^-14 (a multiple of 2^-24, at most 0.17), so the
tensor-core products are exact and only the float32 accumulation order differs from
``dequantize(x̂) @ dequantize(Ŵ).T``. The 2^14 and the global scales (per token for activations, per tensor
or per expert for weights) multiply the float32 accumulator once at the end. On Hopper this moves a quarter
of the bf16 weight bytes, which is the whole win for decode (memory-bound) — if decoding keeps up, so the
per-element work is kept to a few instructions:

- The product is computed transposed, ``out.T = Ŵ @ x.T``: the weight tile is the tensor core's first
  operand (``BLOCK_N`` weight rows, at least the 64 rows of a Hopper warpgroup MMA) and the tokens are the
  narrow side (``BLOCK_M`` ≥ 16), for every row count, so a row's summation order never depends on M.
- A packed byte holds elements ``2j`` (low nibble) and ``2j + 1`` (high nibble); the kernel never
  interleaves them: it contracts the even activation elements against the low nibbles and the odd ones
  against the high nibbles (two products into one accumulator).
- Weight codes are loaded as ``[BLOCK_N, BLOCK_K / 16, 8]`` (8 bytes of one 16-element block share one block
  scale, decoded once and broadcast) and contracted in the order :func:`_mma_order` gives, which hands each
  thread of the tensor-core operand contiguous bytes of two blocks (wide loads, four bytes per decode, no
  shuffles after the decode); the activations are read in the same order.
- A nibble becomes a float16 by placing its three magnitude bits under the float16 exponent
  (``(c & 7) << 9``, a float16 subnormal for magnitude 1) and its sign bit on the sign: that float16 is
  exactly ``e2m1_value(c) * 2^-14``. ``ASM_DECODE`` does this for four bytes (eight nibbles) per inline-PTX
  block with byte-parallel bit operations and multiplies by the scale with ``mul.f16x2``; the pure-Triton
  form gives the same bits (a GPU test checks) and is the one the Triton interpreter, which cannot run PTX,
  executes.

At decode sizes the weight's column tiles give too few programs to keep the GPU's memory system busy, so K
may be split over ``SPLIT_K`` programs, each writing float32 partial sums to its own slice of a workspace
that one deterministic sum reduces (no atomics: the same inputs give the same bits).

The grouped form runs every expert of a layer in one launch: rows are sorted by expert and each program's
row tile belongs to one expert (tile metadata built on the device, so the launch needs no host
synchronisation and can be captured in a CUDA graph).
"""

from __future__ import annotations

import triton
import triton.language as tl

# Eight nibbles of four packed bytes ($4) to float16 ``e2m1 * 2^-14`` times the block scale (f16x2 pairs $5,
# $6), as _e2m1_f16 does one at a time. That float16's low byte is zero and its high byte is the nibble n's
# magnitude bits shifted up by one with the sign on bit 7, so all four bytes' high bytes come from one
# masked pair of shifts and a lop3 ((a | b) & 0x8E per byte: LUT 0xA8), and prmt places them over zero low
# bytes (selector 4 reads the zero register). Outputs: low nibbles of elements 0-1, 2-3 ($0, $1), high
# nibbles ($2, $3).
_DECODE_PTX = tl.constexpr("""
{
.reg .b32 z, k, n, t, u;
mov.b32 z, 0;
mov.b32 k, 0x8E8E8E8E;
and.b32 n, $4, 0x0F0F0F0F;
shl.b32 t, n, 1;
shl.b32 u, n, 4;
lop3.b32 n, t, u, k, 0xA8;
prmt.b32 t, n, z, 0x1404;
mul.rn.f16x2 $0, t, $5;
prmt.b32 t, n, z, 0x3424;
mul.rn.f16x2 $1, t, $6;
and.b32 u, $4, 0xF0F0F0F0;
shr.b32 t, u, 3;
lop3.b32 n, t, u, k, 0xA8;
prmt.b32 t, n, z, 0x1404;
mul.rn.f16x2 $2, t, $5;
prmt.b32 t, n, z, 0x3424;
mul.rn.f16x2 $3, t, $6;
}
""")


@triton.jit
def _e2m1_f16(nibble):
    """float16 ``e2m1_value * 2^-14`` of the E2M1 code in the low 4 bits of int32 ``nibble``."""
    return (((nibble & 7) << 9) | ((nibble & 8) << 12)).to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def _e4m3_f16(byte):
    """float16 value of a non-negative E4M3 byte (uint8): its exponent and mantissa bits under float16's give
    ``value * 2^-8`` (normal and subnormal alike: both formats' subnormals are mantissa times their minimum
    normal), and the product by 2^8 is exact."""
    return ((byte.to(tl.int16) & 0x7F) << 7).to(tl.float16, bitcast=True) * 256.0


@triton.jit
def decode_weights(packed, scale, ASM_DECODE: tl.constexpr):
    """``(low, high)`` float16 ``e2m1_value(nibble) * 2^-14 * scale`` of the low and high nibbles of uint8
    ``packed`` (any shape) with float16 ``scale`` (broadcastable to it; exact products, as every E4M3 scale
    is a float16). ``ASM_DECODE`` (CUDA only) decodes eight nibbles per inline-PTX block; same bits."""
    if ASM_DECODE:
        low, high = tl.inline_asm_elementwise(
            _DECODE_PTX, "=r,=r,=r,=r,r,r,r", [packed, tl.broadcast_to(scale, packed.shape)],
            dtype=(tl.float16, tl.float16), is_pure=True, pack=4,
        )  # fmt: skip
    else:
        c = packed.to(tl.int32)
        low = _e2m1_f16(c) * scale
        high = _e2m1_f16(c >> 4) * scale
    return low, high


@triton.jit
def _mma_order(tile, ROWS: tl.constexpr, HALF: tl.constexpr):
    """``tile [ROWS, HALF / 8, 8]`` (packed bytes in memory order along K) as ``[ROWS, HALF]`` in the order
    that puts a thread's tensor-core operand elements on contiguous bytes.

    A Hopper/Ampere f16 MMA operand gives lane ``t`` (of 4 per row) K positions ``2t, 2t + 1, 2t + 8, 2t + 9``
    of every 16; placing memory byte ``t*4C + c*4 + h*2 + e`` at position ``c*16 + h*8 + t*2 + e`` (``C =
    HALF / 16``) hands each lane ``4C`` consecutive bytes (wide loads, four bytes per decode, two block
    scales instead of ``HALF / 8``). The sum over K is the same set of products in a fixed order, so this
    changes no row's result with M; the activations are read in the same order."""
    C: tl.constexpr = HALF // 16
    t = tl.reshape(tile, (ROWS, 4, C, 2, 2))
    return tl.reshape(tl.permute(t, (0, 2, 3, 1, 4)), (ROWS, HALF))


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
    x_plane,
    M,
    N,
    K: tl.constexpr,
    GROUPED: tl.constexpr,
    GATHER_X: tl.constexpr,
    X_PLANAR: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ASM_DECODE: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    """``out[r, n] = (Σ_k x[r, k] ŵ[n, k]) * gx[r] * gw`` with ``x`` decoded activations ``[T, K]`` (float16
    on GPUs, without their global scale) and ``ŵ`` packed NVFP4 weights (codes ``[.., N, K / 2]`` uint8, block
    scales ``[.., N, K / 16]`` E4M3 bytes). ``K`` must be a multiple of 16 and ``BLOCK_K`` of 16.

    Dense: rows ``r`` in ``[0, M)``; weights ``[N, K]`` with one global scale. Grouped: program ``pid_m``
    handles tile ``pid_m`` of the expert-sorted rows ``[tile_start, tile_end)`` against expert
    ``tile_expert``'s weights (``[E, N, K]``, one global scale per expert); programs past the device-side
    tile count exit. ``GATHER_X`` reads activation row ``x_rows[r]`` for output row ``r`` (one token
    feeding its k experts without a copy). ``X_PLANAR``: ``x`` is instead two planes (even, odd elements;
    the odd one ``x_plane`` elements on) of ``[T, PADDED]`` already in :func:`_mma_order`'s order. With
    ``SPLIT_K`` > 1 program ``pid_k`` sums its share of K into float32 slice ``pid_k`` of ``out``
    (``[SPLIT_K, M, N]``). ``DOT_DTYPE`` is float16 on GPUs (tensor cores); the Triton interpreter, whose
    half-precision dot products are not faithful, multiplies in float32 (and needs ``ASM_DECODE`` off).
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
    GROUPS: tl.constexpr = BLOCK_K // 16  # 16-element blocks (one scale, 8 packed bytes each) per step
    PAIRS: tl.constexpr = K // 2
    PADDED: tl.constexpr = (K + BLOCK_K - 1) // BLOCK_K * HALF  # pairs per planar activation row
    BLOCKS: tl.constexpr = K // 16
    CHUNK: tl.constexpr = (K + SPLIT_K * BLOCK_K - 1) // (SPLIT_K * BLOCK_K) * GROUPS  # blocks per split
    group = tl.arange(0, GROUPS)
    byte = tl.arange(0, 8)
    kk = tl.arange(0, HALF)  # contraction position -> packed byte of the step, as _mma_order places them
    mma_pairs = (kk // 2 % 4) * (HALF // 4) + (kk // 16) * 4 + (kk // 8 % 2) * 2 + kk % 2
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for step in tl.range(0, CHUNK, GROUPS):
        blk = pid_k * CHUNK + step + group  # 16-element block index along K
        blk_ok = blk < BLOCKS
        w_mask = col_ok[:, None] & blk_ok[None, :]
        scale_byte = tl.load(w_scales_ptr + w_rows[:, None] * BLOCKS + blk[None, :], mask=w_mask, other=0)
        scale = _e4m3_f16(scale_byte)  # exact: every E4M3 value is a float16
        packed = tl.load(
            w_codes_ptr + (w_rows[:, None] * PAIRS + blk[None, :] * 8)[:, :, None] + byte[None, None, :],
            mask=w_mask[:, :, None],
            other=0,
        )
        low, high = decode_weights(packed, scale[:, :, None], ASM_DECODE)
        w_low = _mma_order(low, BLOCK_N, HALF).to(DOT_DTYPE)
        w_high = _mma_order(high, BLOCK_N, HALF).to(DOT_DTYPE)
        # activation element 2p (even) meets the low nibble of packed byte p, 2p + 1 the high one, at the
        # contraction positions _mma_order gave byte p ([BLOCK_M, BLOCK_K] loaded, split in even and odd)
        if X_PLANAR:  # planes already in contraction order: contiguous rows
            q = (pid_k * CHUNK + step) * 8 + kk
            x_offs = x_rows[:, None] * PADDED + q[None, :]
            x_mask = row_ok[:, None] & (q < PADDED)[None, :]
            x_even = tl.load(x_ptr + x_offs, mask=x_mask, other=0.0)
            x_odd = tl.load(x_ptr + x_plane + x_offs, mask=x_mask, other=0.0)
        else:
            p = (pid_k * CHUNK + step) * 8 + mma_pairs
            x_offs = (x_rows[:, None] * K + 2 * p[None, :])[:, :, None] + tl.arange(0, 2)[None, None, :]
            x_mask = (row_ok[:, None] & (p < PAIRS)[None, :])[:, :, None]
            x_even, x_odd = tl.split(tl.load(x_ptr + x_offs, mask=x_mask, other=0.0))
        acc = tl.dot(w_low, tl.trans(x_even), acc)
        acc = tl.dot(w_high, tl.trans(x_odd), acc)

    gx = tl.load(x_g_ptr + x_rows, mask=row_ok, other=0.0)
    gw = tl.load(w_g_ptr + expert)
    y = ((acc * 16384.0) * gx[None, :]) * gw  # 2^14: the weights' decoding offset, exact
    out_offs = rows[None, :] * N + cols[:, None]
    out_mask = col_ok[:, None] & row_ok[None, :]
    if SPLIT_K == 1:
        tl.store(out_ptr + out_offs, y.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        tl.store(out_ptr + pid_k.to(tl.int64) * M * N + out_offs, y, mask=out_mask)


@triton.jit
def split_sum_kernel(parts_ptr, out_ptr, NUMEL, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    """``out = parts[0] + parts[1] + …`` over float32 ``parts [SPLIT_K, NUMEL]``, element by element in
    split order (the order :func:`.row_invariance.sum_in_split_order` fixes), cast to ``out``'s dtype."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < NUMEL
    part = parts_ptr + offs
    total = tl.load(part, mask=ok, other=0.0)
    for _ in tl.static_range(1, SPLIT_K):
        part += NUMEL  # 64-bit pointer steps: SPLIT_K * NUMEL may pass 2^31
        total += tl.load(part, mask=ok, other=0.0)
    tl.store(out_ptr + offs, total.to(out_ptr.dtype.element_ty), mask=ok)
