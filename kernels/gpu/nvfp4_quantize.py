"""Triton NVFP4 quantise and dequantise, bit-identical to :mod:`nibble.kernels.reference.nvfp4`.

One program handles ``BLOCK_M`` rows in chunks of ``CHUNK`` 16-element blocks. Each block is loaded as
two 8-element halves, so one thread holds a whole block: its maximum, its scale, its 16-term error sum
and its packed codes are computed in registers, once per block, with no cross-thread traffic. With
per-token scales and rows up to a few thousand blocks, the program reduces each row's amax in a first
pass (an element-wise running maximum, reduced once) and quantises in a second whose reads hit the
cache. Longer rows (expert stacks quantised per expert) get their amax from a separate reduction.

Every step gives the float32 result of docs/design.md §2.2–2.3. The traps §2 lists are avoided as
follows: divisions use ``tl.div_rn`` (Triton's ``/`` is approximate); the launcher turns floating-point
contraction off (``enable_fp_fusion=False``) so ``a * b + c`` is never an FMA; the 4/6 block error is
added element by element in index order; E4M3 and E2M1 rounding are done with integer and exact float32
arithmetic on the bits rather than conversion instructions, so the Triton interpreter (used by the CPU
tests) and every GPU round identically. Where a step is computed in another form than the spec's
(E2M1 rounding and the 4/6 path's codes from the grid magnitude here, the 4/6 error in
:mod:`.nvfp4_four_over_six`), its docstring proves it gives the same bits and
tests/kernels/test_quantize_arithmetic.py checks it (E2M1 and its codes on every float32 near the grid).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .nvfp4_four_over_six import block_error_exact, block_error_fast, fast_rows, fast_terms, unpack8

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
def e2m1_snap(v):
    """The add that rounds ``min(|v|, 6)`` to the E2M1 grid (see :func:`e2m1_round`): ``(t, magic_bits)``,
    float32 and int32 like ``v``, with ``t = M + min(|v|, 6)`` and ``magic_bits`` the bits of ``M``."""
    mag = tl.minimum(tl.abs(v), 6.0)
    magic_bits = tl.maximum(mag.to(tl.int32, bitcast=True) & 0x7F800000, 0x3F800000) + (22 << 23)  # 2^(22+e)
    return mag + magic_bits.to(tl.float32, bitcast=True), magic_bits


@triton.jit
def e2m1_magnitude(v):
    """The magnitude :func:`e2m1_round` rounds ``v`` to, ``|e2m1_value(code)|`` (float32, like ``v``): the 4/6
    error needs it for both candidates, and :func:`code_word` codes the chosen one from it."""
    t, magic_bits = e2m1_snap(v)
    return t - magic_bits.to(tl.float32, bitcast=True)


@triton.jit
def e2m1_round(v):
    """E2M1 rounding of float32 ``v`` (any value but NaN) to its code (int32 0..15, like ``v``).

    The code is the nearest grid point of ``clamp(v, -6, 6)``, ties to the even code, sign bit set for
    ``v < 0`` (an exact −0.0 codes as +0, as in Transformer Engine): docs/design.md §2.1. With
    ``m = min(|v|, 6)`` and ``e = max(0, floor(log2 m))``, the grid spacing in ``m``'s binade is
    ``2^(e-1)`` (0.5 below 2, then 1, then 2), which is the float32 ulp of ``M = 2^(22+e)``: ``M + m``
    (one IEEE add, ``m < 2^(e+1) <= M``) rounds ``m`` to the grid with ties to the even multiple of the
    spacing, and the even multiples are exactly the even codes. The bits of ``M + m`` minus those of
    ``M`` count spacings, ``k``; the code is ``k + 2e``, and ``2e = (bits of M >> 22) - 298``. Checked
    against the 7-threshold definition on every float32 by tests/kernels/test_quantize_arithmetic.py.
    """
    t, magic_bits = e2m1_snap(v)
    code = (t.to(tl.int32, bitcast=True) - magic_bits) + ((magic_bits >> 22) - 298)
    return code | tl.where(v < 0.0, 8, 0)


@triton.jit
def _code_nibble(r, v, SLOT: tl.constexpr):
    """Code ``SLOT`` of a word (bits ``4·SLOT..4·SLOT+3``) from its rounded magnitude ``r = e2m1_magnitude(v)``
    and ``v``.

    On the grid ``r + 2`` is exact: 0, 0.5, 1, 1.5 → 2, 2.5, 3, 3.5 (exponent 128, whose low bit, bit 23,
    is 0), 2, 3, 4 → 4, 5, 6 (exponent 129, bit 23 set) and 6 → 8. Each code step is 2^21 in the bits and
    no bit below 2^21 is set, so bits 21-23 of ``min(bits(r + 2), bits(7))`` are the magnitude code (6's 8
    capped at 7), shifted straight to their place; the sign bit is that of :func:`e2m1_round`.
    """
    bits = tl.minimum((r + 2.0).to(tl.int32, bitcast=True), 0x40E00000)
    if 4 * SLOT >= 21:
        magnitude = (bits << (4 * SLOT - 21)) & (7 << (4 * SLOT))
    else:
        magnitude = (bits >> (21 - 4 * SLOT)) & (7 << (4 * SLOT))
    sign = (8 << (4 * SLOT)) if SLOT < 7 else -2147483648  # bit 31, as an int32
    return magnitude | tl.where(v < 0.0, sign, 0)


@triton.jit
def code_word(r, v):
    """int32 ``[BM, NB]`` word of the codes of :func:`e2m1_round` for 8 elements ``[BM, NB, 8]``, from their
    rounded magnitudes ``r = e2m1_magnitude(v)`` and ``v``: the layout of :func:`_pack8`.

    4/6 keeps both candidates' ``r`` for its errors and codes the chosen one from them (SASS: 47.3 instructions
    per element against 51.1 re-rounding it from ``x``); the standard path, which has no ``r`` to reuse, is
    cheaper through :func:`e2m1_round` and :func:`_pack8` (18.6 against 19.9).
    """
    r0, r1, r2, r3, r4, r5, r6, r7 = unpack8(r)
    v0, v1, v2, v3, v4, v5, v6, v7 = unpack8(v)
    word = _code_nibble(r0, v0, 0) | _code_nibble(r1, v1, 1) | _code_nibble(r2, v2, 2) | _code_nibble(r3, v3, 3)
    return word | _code_nibble(r4, v4, 4) | _code_nibble(r5, v5, 5) | _code_nibble(r6, v6, 6) | _code_nibble(r7, v7, 7)


@triton.jit
def e2m1_value(code):
    """float32 value of E2M1 codes (int 0..15), built from bits so that code 8 is −0.0: 0x3F000000 +
    (magnitude << 22) is exact for magnitudes 2..7 (1 … 6); magnitude 1 is 0.5 (0x3F000000), 0 is +0."""
    c = code.to(tl.int32)
    c3 = c & 7
    bits = tl.where(c3 < 2, c3 * 0x3F000000, (c3 << 22) + 0x3F000000) | ((c & 8) << 28)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _pack8(codes):
    """int32 ``[BM, NB]`` word of 8 codes ``[BM, NB, 8]``: code ``i`` in bits ``4i..4i+3`` (little-endian
    bytes: element 2i in the low nibble, as docs/design.md §2.1 packs them)."""
    even, odd = tl.split(tl.reshape(codes, (codes.shape[0], codes.shape[1], 4, 2)))
    b = even | (odd << 4)  # bytes 0..3
    b0b2, b1b3 = tl.split(tl.reshape(b, (codes.shape[0], codes.shape[1], 2, 2)))
    lo, hi = tl.split(b0b2 | (b1b3 << 8))
    return lo | (hi << 16)


@triton.jit
def _encode_scale(sf, g):
    """``min(1 / (sf · g), FLT_MAX)`` ``[BM, NB]``: a zero scale's infinite reciprocal saturates, as TE does."""
    denom = sf * g
    return tl.minimum(tl.div_rn(tl.full(denom.shape, 1.0, tl.float32), denom), FLT_MAX)


@triton.jit
def _load_eight(ptrs, mask):
    """8 contiguous elements per ``[BM, NB]`` entry as ``[BM, NB, 8]`` (pointers to the first of each), in one
    thread's registers: float32 takes two 16-byte loads, since the compiler vectorises to 16 bytes."""
    if ptrs.dtype.element_ty == tl.float32:
        four = tl.arange(0, 4)[None, None, :]
        a = tl.load(ptrs[:, :, None] + four, mask=mask[:, :, None], other=0.0)
        b = tl.load(ptrs[:, :, None] + 4 + four, mask=mask[:, :, None], other=0.0)
        return tl.reshape(tl.permute(tl.join(a, b), (0, 1, 3, 2)), (a.shape[0], a.shape[1], 8))
    else:
        return tl.load(ptrs[:, :, None] + tl.arange(0, 8)[None, None, :], mask=mask[:, :, None], other=0.0)


@triton.jit
def _load_halves(x_ptr, rows, row_ok, chunk, KB, stride_xm, CHUNK: tl.constexpr):
    """Elements 0-7 and 8-15 of chunk ``chunk``'s ``CHUNK`` blocks per row: two ``[BM, CHUNK, 8]`` tensors
    in the input dtype, laid out alike, so each thread gets both halves of its blocks."""
    blocks = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = row_ok[:, None] & (blocks < KB)[None, :]
    first = x_ptr + rows[:, None] * stride_xm + blocks[None, :] * 16
    return _load_eight(first, mask), _load_eight(first + 8, mask)


@triton.jit
def _running_max(running, x_ptr, rows, row_ok, chunk, KB, stride_xm, CHUNK: tl.constexpr):
    """``running`` ``[BM, CHUNK, 8]`` raised to the magnitudes of chunk ``chunk`` (exact in the input dtype)."""
    lo, hi = _load_halves(x_ptr, rows, row_ok, chunk, KB, stride_xm, CHUNK)
    return tl.maximum(running, tl.maximum(tl.abs(lo), tl.abs(hi))).to(x_ptr.dtype.element_ty)


@triton.jit
def _quantize_chunk(
    x_lo, x_hi, amax, fast, encode, g, rows, row_ok, chunk, KB, codes_ptr, scales_ptr, choice_ptr, operand_ptr,
    E: tl.constexpr, FOUR_OVER_SIX: tl.constexpr, MSE: tl.constexpr, WRITE_CHOICE: tl.constexpr,
    WRITE_OPERAND: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    """Steps 3-4 of docs/design.md §2.2 (and §2.3's choice) for one chunk; stores codes, scales, choices and
    the decoded operand."""
    blocks = chunk * CHUNK + tl.arange(0, CHUNK)
    block_ok = row_ok[:, None] & (blocks < KB)[None, :]
    bmax = tl.max(tl.maximum(tl.abs(x_lo), tl.abs(x_hi)), axis=2)  # [BM, CHUNK]
    if FOUR_OVER_SIX:
        base = tl.div_rn(bmax, tl.full(bmax.shape, 6.0, tl.float32)) * encode[:, None]
        sf, sf_byte = e4m3_round(tl.minimum(base, 448.0))
        sf4, sf4_byte = e4m3_round(tl.minimum(base * 1.5, 448.0))
        enc = _encode_scale(sf, g[:, None])
        enc4 = _encode_scale(sf4, g[:, None])
        r_lo = e2m1_magnitude(x_lo * enc[:, :, None])
        r_hi = e2m1_magnitude(x_hi * enc[:, :, None])
        r4_lo = e2m1_magnitude(x_lo * enc4[:, :, None])
        r4_hi = e2m1_magnitude(x_hi * enc4[:, :, None])
        if fast:
            b1, b15 = fast_terms(sf, amax, E * 6.0)
            b1_4, b15_4 = fast_terms(sf4, amax, E * 6.0)
            err6 = block_error_fast(r_lo, r_hi, x_lo, x_hi, b1, b15, MSE)
            err4 = block_error_fast(r4_lo, r4_hi, x_lo, x_hi, b1_4, b15_4, MSE)
        else:
            err6 = block_error_exact(r_lo, r_hi, x_lo, x_hi, sf, amax, E * 6.0, MSE)
            err4 = block_error_exact(r4_lo, r4_hi, x_lo, x_hi, sf4, amax, E * 6.0, MSE)
        to4 = err4 < err6  # ties keep map-to-6
        sf_byte = tl.where(to4, sf4_byte, sf_byte)
        enc = tl.where(to4, enc4, enc)
        r_lo = tl.where(to4[:, :, None], r4_lo, r_lo)
        r_hi = tl.where(to4[:, :, None], r4_hi, r_hi)
        # the sign from x · enc, not x: a product that underflows to -0 codes as +0, as in e2m1_round
        v_lo = x_lo * enc[:, :, None]
        v_hi = x_hi * enc[:, :, None]
        word_lo = code_word(r_lo, v_lo)
        word_hi = code_word(r_hi, v_hi)
        if WRITE_CHOICE:
            tl.store(choice_ptr + rows[:, None] * KB + blocks[None, :], to4.to(tl.uint8), mask=block_ok)
        if WRITE_OPERAND:
            # the code's value (its sign is v's, as the code's: -0 for r = 0) times the chosen scale; a product
            # by -1, since Triton negates as 0 - r, which gives +0
            scale = tl.where(to4, sf4, sf)[:, :, None]
            value_lo = tl.where(v_lo < 0.0, r_lo * -1.0, r_lo) * scale
            value_hi = tl.where(v_hi < 0.0, r_hi * -1.0, r_hi) * scale
    else:
        # TE folds 1/6 into the row's scale: bmax · (S · fl(1/6)), a different rounding from (bmax / 6) · S
        multiplier = encode * ONE_SIXTH
        sf, sf_byte = e4m3_round(tl.minimum(bmax * multiplier[:, None], 448.0))
        enc = _encode_scale(sf, g[:, None])
        codes_lo = e2m1_round(x_lo * enc[:, :, None])
        codes_hi = e2m1_round(x_hi * enc[:, :, None])
        word_lo = _pack8(codes_lo)
        word_hi = _pack8(codes_hi)
        if WRITE_OPERAND:
            value_lo = e2m1_value(codes_lo) * sf[:, :, None]
            value_hi = e2m1_value(codes_hi) * sf[:, :, None]
    # codes_ptr is int32: two words (16 codes) per block
    word_offs = (rows[:, None] * (KB * 2) + blocks[None, :] * 2)[:, :, None] + tl.arange(0, 2)[None, None, :]
    tl.store(codes_ptr + word_offs, tl.join(word_lo, word_hi), mask=block_ok[:, :, None])
    tl.store(scales_ptr + rows[:, None] * KB + blocks[None, :], sf_byte, mask=block_ok)
    if WRITE_OPERAND:
        first = operand_ptr + (rows[:, None] * (KB * 16) + blocks[None, :] * 16)[:, :, None] + tl.arange(0, 8)
        tl.store(first, value_lo.to(operand_ptr.dtype.element_ty), mask=block_ok[:, :, None])
        tl.store(first + 8, value_hi.to(operand_ptr.dtype.element_ty), mask=block_ok[:, :, None])


@triton.jit
def nvfp4_quantize_kernel(
    x_ptr,
    amax_ptr,
    codes_ptr,
    scales_ptr,
    g_ptr,
    choice_ptr,
    operand_ptr,
    M,
    KB,
    stride_xm,
    E: tl.constexpr,
    PER_TOKEN: tl.constexpr,
    AMAX_IN_KERNEL: tl.constexpr,
    FOUR_OVER_SIX: tl.constexpr,
    MSE: tl.constexpr,
    WRITE_CHOICE: tl.constexpr,
    WRITE_OPERAND: tl.constexpr,
    BLOCK_M: tl.constexpr,
    CHUNK: tl.constexpr,
    NUM_CHUNKS: tl.constexpr,
    ROW_CHUNKS: tl.constexpr,
    UNROLL_AMAX: tl.constexpr,
):
    """Quantise rows ``x [M, KB*16]`` (float32/bf16/fp16) into codes ``int32 [M, KB*2]`` (8 packed codes a
    word), block-scale bytes ``uint8 [M, KB]`` and decode scales ``float32 [M]`` (per token) or ``[1]``; with
    ``WRITE_OPERAND`` also ``e2m1_value(code) * block_scale`` ``[M, KB*16]`` in ``operand_ptr``'s dtype (exact).

    With ``AMAX_IN_KERNEL`` a first pass over a row's ``ROW_CHUNKS`` chunks reduces its amax and the second
    quantises the program's ``NUM_CHUNKS`` of them, from chunk ``pid_k * NUM_CHUNKS`` (the re-read is served
    by the cache): one program owns whole rows (``NUM_CHUNKS == ROW_CHUNKS``), or, when the rows are too few
    to fill the GPU, the programs of a row share its chunks and each reduces the amax itself. ``UNROLL_AMAX``
    issues the first pass's loads together (a program that quantises a chunk or two would otherwise wait out
    one load latency per chunk). Otherwise the amax comes from ``amax_ptr`` and each program quantises one
    chunk (``NUM_CHUNKS == 1``).
    """
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    rows = rows.to(tl.int64)
    if AMAX_IN_KERNEL:
        # a running maximum per element (exact in the input dtype), reduced across threads once at the end
        running = tl.zeros((BLOCK_M, CHUNK, 8), dtype=x_ptr.dtype.element_ty)
        if UNROLL_AMAX:
            for a in tl.static_range(ROW_CHUNKS):
                running = _running_max(running, x_ptr, rows, row_ok, a, KB, stride_xm, CHUNK)
        else:
            for a in tl.range(0, ROW_CHUNKS):
                running = _running_max(running, x_ptr, rows, row_ok, a, KB, stride_xm, CHUNK)
        amax = tl.max(tl.max(running.to(tl.float32), axis=2), axis=1)
    elif PER_TOKEN:
        amax = tl.load(amax_ptr + rows, mask=row_ok, other=0.0)
    else:
        amax = tl.load(amax_ptr + rows * 0)
    # S = min(6E / amax, FLT_MAX), 1 where 0; an all-zero row's amax 0 gives S = FLT_MAX, g = 2^-128
    six_e = tl.full(amax.shape, E * 6.0, tl.float32)
    encode = tl.minimum(tl.div_rn(six_e, amax), FLT_MAX)
    encode = tl.where(encode == 0.0, 1.0, encode)
    g = tl.div_rn(tl.full(encode.shape, 1.0, tl.float32), encode)
    # one branch per program: a program with an extreme row takes the exact form for all its rows
    fast = tl.min(fast_rows(amax, row_ok, E * 6.0).to(tl.int32)) == 1
    for i in tl.range(0, NUM_CHUNKS):
        c = pid_k * NUM_CHUNKS + i
        lo, hi = _load_halves(x_ptr, rows, row_ok, c, KB, stride_xm, CHUNK)
        _quantize_chunk(
            lo.to(tl.float32), hi.to(tl.float32), amax, fast, encode, g, rows, row_ok, c, KB, codes_ptr, scales_ptr,
            choice_ptr, operand_ptr, E, FOUR_OVER_SIX, MSE, WRITE_CHOICE, WRITE_OPERAND, CHUNK,
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
