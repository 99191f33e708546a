"""Triton NVFP4 quantise and dequantise, bit-identical to :mod:`nibble.kernels.reference.nvfp4`.

One program handles ``BLOCK_M`` rows in chunks of ``CHUNK`` 16-element blocks (small enough that the
4/6 path's intermediates stay in registers). With per-token scales and rows up to a few thousand blocks,
the program reduces each row's amax in a first pass and quantises in a second whose reads hit the
cache: one read of the input from memory, one write of codes, block scales and global scales. Longer
rows (expert stacks quantised per expert) get their amax from a separate reduction so that many
programs can share a row.

Every step is the float32 operation of docs/design.md §2.2–2.3 in the same order. The traps §2 lists are
avoided as follows: divisions use ``tl.div_rn`` (Triton's ``/`` is approximate); the launcher turns
floating-point contraction off (``enable_fp_fusion=False``) so ``a * b + c`` is never an FMA; the 4/6
block error is added element by element in index order; E4M3 rounding is done with integer
arithmetic on the float32 bits rather than the conversion instruction, so the Triton interpreter
(used by the CPU tests) and every GPU round identically.
"""

from __future__ import annotations

import triton
import triton.language as tl

FLT_MAX = tl.constexpr(3.4028234663852886e38)
ONE_SIXTH = tl.constexpr(0.1666666716337204)  # fl(1/6): the float32 nearest to 1/6, exact as a literal


@triton.jit
def e4m3_round(v):
    """Round non-negative float32 ``v <= 448`` to E4M3 (ties to even): ``(value float32, byte uint8)``."""
    bits = v.to(tl.int32, bitcast=True)
    # normal range (>= 2^-6): keep 3 mantissa bits, round half to even on the 20 dropped bits
    lsb = (bits >> 20) & 1
    rounded = (bits + 0x7FFFF + lsb) & ~0xFFFFF
    normal_value = rounded.to(tl.float32, bitcast=True)
    normal_byte = ((((rounded >> 23) & 0xFF) - 120) << 3) | ((rounded >> 20) & 7)
    # subnormal range: multiples of 2^-9; v * 2^9 < 8 is exact and 2^23 forces rounding to an integer
    t = v * 512.0
    t = (t + 8388608.0) - 8388608.0
    sub_value = t * 0.001953125
    sub_byte = t.to(tl.int32)  # 8 is the carry into the smallest normal, whose byte is also 8
    is_normal = v >= 0.015625
    value = tl.where(is_normal, normal_value, sub_value)
    byte = tl.where(is_normal, normal_byte, sub_byte)
    return value, byte.to(tl.uint8)


@triton.jit
def e4m3_decode(byte):
    """float32 value of a non-negative E4M3 byte (uint8/int32 tensor)."""
    b = byte.to(tl.int32)
    exp = b >> 3
    mant = b & 7
    normal = (((exp + 120) << 23) | (mant << 20)).to(tl.float32, bitcast=True)
    return tl.where(exp == 0, mant.to(tl.float32) * 0.001953125, normal)


@triton.jit
def e2m1_code(v):
    """E2M1 code (uint8, 0..15) of float32 ``v``: nearest grid point, ties to the even code; the sign bit is
    set for ``v < 0`` (an exact −0.0 codes as +0, as in Transformer Engine)."""
    mag = tl.abs(v)
    code = (mag > 0.25).to(tl.int32) + (mag >= 0.75).to(tl.int32) + (mag > 1.25).to(tl.int32)
    code += (mag >= 1.75).to(tl.int32) + (mag > 2.5).to(tl.int32) + (mag >= 3.5).to(tl.int32)
    code += (mag > 5.0).to(tl.int32)
    sign = (v < 0.0).to(tl.int32)
    return (code | (sign << 3)).to(tl.uint8)


@triton.jit
def e2m1_value(code):
    """float32 value of E2M1 codes (int 0..15), built from bits so that code 8 is −0.0: 0x3F000000 +
    (magnitude << 22) is exact for magnitudes 2..7 (1 … 6); magnitude 1 is 0.5 (0x3F000000), 0 is +0."""
    c = code.to(tl.int32)
    c3 = c & 7
    bits = tl.where(c3 < 2, c3 * 0x3F000000, (c3 << 22) + 0x3F000000) | ((c & 8) << 28)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _sum16_in_order(t, BM: tl.constexpr, NB: tl.constexpr):
    """``t[..., 0] + t[..., 1] + ... + t[..., 15]`` for ``t [BM, NB, 16]``, one rounding per add, in order."""
    even, odd = tl.split(tl.reshape(t, (BM, NB, 8, 2)))  # elements 0,2,..,14 and 1,3,..,15
    e0, e1 = tl.split(tl.reshape(even, (BM, NB, 4, 2)))  # 0,4,8,12 and 2,6,10,14
    o0, o1 = tl.split(tl.reshape(odd, (BM, NB, 4, 2)))  # 1,5,9,13 and 3,7,11,15
    e00, e01 = tl.split(tl.reshape(e0, (BM, NB, 2, 2)))  # 0,8 and 4,12
    e10, e11 = tl.split(tl.reshape(e1, (BM, NB, 2, 2)))  # 2,10 and 6,14
    o00, o01 = tl.split(tl.reshape(o0, (BM, NB, 2, 2)))  # 1,9 and 5,13
    o10, o11 = tl.split(tl.reshape(o1, (BM, NB, 2, 2)))  # 3,11 and 7,15
    x0, x8 = tl.split(e00)
    x4, x12 = tl.split(e01)
    x2, x10 = tl.split(e10)
    x6, x14 = tl.split(e11)
    x1, x9 = tl.split(o00)
    x5, x13 = tl.split(o01)
    x3, x11 = tl.split(o10)
    x7, x15 = tl.split(o11)
    s = x0 + x1
    s = s + x2
    s = s + x3
    s = s + x4
    s = s + x5
    s = s + x6
    s = s + x7
    s = s + x8
    s = s + x9
    s = s + x10
    s = s + x11
    s = s + x12
    s = s + x13
    s = s + x14
    s = s + x15
    return s


@triton.jit
def _encode(x, sf, g):
    """Codes ``[BM, NB, 16]`` of ``x`` under block scales ``sf [BM, NB]`` and decode scales ``g [BM, 1]``;
    a zero scale gives an infinite reciprocal, saturated at FLT_MAX as TE does."""
    denom = sf * g
    encode = tl.minimum(tl.div_rn(tl.full(denom.shape, 1.0, tl.float32), denom), FLT_MAX)
    scaled = tl.minimum(tl.maximum(x * encode[:, :, None], -6.0), 6.0)
    return e2m1_code(scaled)


@triton.jit
def _block_error(codes, sf, amax, x, SIX_E: tl.constexpr, MSE: tl.constexpr, BM: tl.constexpr, NB: tl.constexpr):
    """4/6 candidate error per block (docs/design.md §2.3): ``[BM, NB]`` float32."""
    d = e2m1_value(codes) * sf[:, :, None]
    d = d * amax[:, None, None]
    d = tl.div_rn(d, tl.full(d.shape, SIX_E, tl.float32))
    diff = d - x
    if MSE:
        per = diff * diff
    else:
        per = tl.abs(diff)
    return _sum16_in_order(per, BM, NB)


@triton.jit
def _load_chunk(x_ptr, rows, row_ok, chunk, KB, stride_xm, CHUNK: tl.constexpr):
    """Chunk ``chunk`` of ``CHUNK`` 16-element blocks of each row, as float32 ``[BM, CHUNK, 16]``."""
    blocks = chunk * CHUNK + tl.arange(0, CHUNK)
    elems = tl.arange(0, 16)
    mask = row_ok[:, None, None] & (blocks < KB)[None, :, None]
    offs = rows[:, None, None] * stride_xm + (blocks[None, :, None] * 16 + elems[None, None, :])
    return tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _quantize_chunk(
    x, amax, encode, g, rows, row_ok, chunk, KB, codes_ptr, scales_ptr, choice_ptr,
    E: tl.constexpr, FOUR_OVER_SIX: tl.constexpr, MSE: tl.constexpr, WRITE_CHOICE: tl.constexpr,
    BLOCK_M: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    """Steps 3-4 of docs/design.md §2.2 (and §2.3's choice) for one chunk; stores codes, scales and choices."""
    blocks = chunk * CHUNK + tl.arange(0, CHUNK)
    block_ok = blocks < KB
    bmax = tl.max(tl.abs(x), axis=2)  # [BM, CHUNK]
    if FOUR_OVER_SIX:
        base = tl.div_rn(bmax, tl.full(bmax.shape, 6.0, tl.float32)) * encode[:, None]
        sf, sf_byte = e4m3_round(tl.minimum(base, 448.0))
        sf4, sf4_byte = e4m3_round(tl.minimum(base * 1.5, 448.0))
        codes = _encode(x, sf, g[:, None])
        codes4 = _encode(x, sf4, g[:, None])
        err6 = _block_error(codes, sf, amax, x, E * 6.0, MSE, BLOCK_M, CHUNK)
        err4 = _block_error(codes4, sf4, amax, x, E * 6.0, MSE, BLOCK_M, CHUNK)
        to4 = err4 < err6
        sf_byte = tl.where(to4, sf4_byte, sf_byte)
        codes = tl.where(to4[:, :, None], codes4, codes)
        if WRITE_CHOICE:
            tl.store(
                choice_ptr + rows[:, None] * KB + blocks[None, :],
                to4.to(tl.uint8),
                mask=row_ok[:, None] & block_ok[None, :],
            )
    else:
        # TE folds 1/6 into the row's scale: bmax · (S · fl(1/6)), a different rounding from (bmax / 6) · S
        multiplier = encode * ONE_SIXTH
        sf, sf_byte = e4m3_round(tl.minimum(bmax * multiplier[:, None], 448.0))
        codes = _encode(x, sf, g[:, None])

    nibble_weight = tl.where(tl.arange(0, 2) == 0, 1, 16)[None, None, None, :]
    packed = tl.sum(tl.reshape(codes.to(tl.int32), (BLOCK_M, CHUNK, 8, 2)) * nibble_weight, axis=3).to(tl.uint8)
    pairs = tl.arange(0, 8)
    code_offs = rows[:, None, None] * (KB * 8) + (blocks[None, :, None] * 8 + pairs[None, None, :])
    tl.store(codes_ptr + code_offs, packed, mask=row_ok[:, None, None] & block_ok[None, :, None])
    tl.store(scales_ptr + rows[:, None] * KB + blocks[None, :], sf_byte, mask=row_ok[:, None] & block_ok[None, :])


@triton.jit
def nvfp4_quantize_kernel(
    x_ptr,
    amax_ptr,
    codes_ptr,
    scales_ptr,
    g_ptr,
    choice_ptr,
    M,
    KB,
    stride_xm,
    E: tl.constexpr,
    PER_TOKEN: tl.constexpr,
    AMAX_IN_KERNEL: tl.constexpr,
    FOUR_OVER_SIX: tl.constexpr,
    MSE: tl.constexpr,
    WRITE_CHOICE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    CHUNK: tl.constexpr,
    NUM_CHUNKS: tl.constexpr,
):
    """Quantise rows ``x [M, KB*16]`` (float32/bf16/fp16) into codes ``uint8 [M, KB*8]``, block-scale bytes
    ``uint8 [M, KB]`` and decode scales ``float32 [M]`` (per token) or ``[1]`` (per tensor).

    With ``AMAX_IN_KERNEL`` one program owns whole rows: a first pass over its ``NUM_CHUNKS`` chunks reduces
    the row amax, the second quantises them (the re-read is served by the cache). Otherwise the amax comes
    from ``amax_ptr`` and each program quantises one chunk (``NUM_CHUNKS == 1``).
    """
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    rows = rows.to(tl.int64)
    if AMAX_IN_KERNEL:
        amax = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for c in tl.range(0, NUM_CHUNKS):
            x = _load_chunk(x_ptr, rows, row_ok, c, KB, stride_xm, CHUNK)
            amax = tl.maximum(amax, tl.max(tl.max(tl.abs(x), axis=2), axis=1))
    elif PER_TOKEN:
        amax = tl.load(amax_ptr + rows, mask=row_ok, other=0.0)
    else:
        amax = tl.load(amax_ptr + rows * 0)
    # S = min(6E / amax, FLT_MAX), 1 where 0; an all-zero row's amax 0 gives S = FLT_MAX, g = 2^-128
    six_e = tl.full(amax.shape, E * 6.0, tl.float32)
    encode = tl.minimum(tl.div_rn(six_e, amax), FLT_MAX)
    encode = tl.where(encode == 0.0, 1.0, encode)
    g = tl.div_rn(tl.full(encode.shape, 1.0, tl.float32), encode)
    for i in tl.range(0, NUM_CHUNKS):
        c = pid_k * NUM_CHUNKS + i
        x = _load_chunk(x_ptr, rows, row_ok, c, KB, stride_xm, CHUNK)
        _quantize_chunk(
            x, amax, encode, g, rows, row_ok, c, KB, codes_ptr, scales_ptr, choice_ptr,
            E, FOUR_OVER_SIX, MSE, WRITE_CHOICE, BLOCK_M, CHUNK,
        )  # fmt: skip
    if PER_TOKEN:
        tl.store(g_ptr + rows, g, mask=row_ok & (pid_k == 0))
    else:
        tl.store(g_ptr + rows * 0, g, mask=(rows == 0) & (pid_k == 0) & (pid_m == 0))


@triton.jit
def nvfp4_dequantize_kernel(
    codes_ptr,
    scales_ptr,
    g_ptr,
    out_ptr,
    M,
    KB,
    G_PER_ROW: tl.constexpr,
    BLOCK_M: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """``out [M, KB*16] = e2m1_value(code) * float(block_scale) * g`` in float32, cast to ``out``'s dtype."""
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    blocks = pid_k * CHUNK + tl.arange(0, CHUNK)
    row_ok = rows < M
    block_ok = blocks < KB
    pairs = tl.arange(0, 8)
    m2 = row_ok[:, None] & block_ok[None, :]
    m3 = row_ok[:, None, None] & block_ok[None, :, None]
    packed = tl.load(
        codes_ptr + rows[:, None, None].to(tl.int64) * (KB * 8) + blocks[None, :, None] * 8 + pairs[None, None, :],
        mask=m3,
        other=0,
    )
    sf = e4m3_decode(tl.load(scales_ptr + rows[:, None].to(tl.int64) * KB + blocks[None, :], mask=m2, other=0))
    if G_PER_ROW:
        g = tl.load(g_ptr + rows, mask=row_ok, other=0.0)
    else:
        g = tl.load(g_ptr + rows * 0)
    lo = e2m1_value(packed & 15) * sf[:, :, None]
    hi = e2m1_value(packed >> 4) * sf[:, :, None]
    lo = lo * g[:, None, None]
    hi = hi * g[:, None, None]
    first = (tl.arange(0, 2) == 0)[None, None, None, :]
    out = tl.reshape(tl.where(first, lo[:, :, :, None], hi[:, :, :, None]), (BLOCK_M, CHUNK, 16))
    elems = tl.arange(0, 16)
    out_offs = rows[:, None, None].to(tl.int64) * (KB * 16) + blocks[None, :, None] * 16 + elems[None, None, :]
    tl.store(out_ptr + out_offs, out.to(out_ptr.dtype.element_ty), mask=m3)
