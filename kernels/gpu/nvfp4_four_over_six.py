"""The four-over-six block error of docs/design.md §2.3 for the Triton quantise kernel
(:mod:`nibble.kernels.gpu.nvfp4_quantize`): the spec's per-element ``d`` evaluated once per grid
magnitude for any block, and a form with two float64 products per block for rows where it gives the same
bits (proofs in the docstrings; tests/kernels/test_quantize_arithmetic.py checks both against the spec's
form). Compiled with floating-point contraction off, like the kernel that calls them.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def unpack8(t):
    """The 8 slices ``t[..., 0], ..., t[..., 7]`` of ``t [BM, NB, 8]`` (registers of one thread: free)."""
    even, odd = tl.split(tl.reshape(t, (t.shape[0], t.shape[1], 4, 2)))  # 0,2,4,6 and 1,3,5,7
    e0, e1 = tl.split(tl.reshape(even, (t.shape[0], t.shape[1], 2, 2)))  # 0,4 and 2,6
    o0, o1 = tl.split(tl.reshape(odd, (t.shape[0], t.shape[1], 2, 2)))  # 1,5 and 3,7
    x0, x4 = tl.split(e0)
    x2, x6 = tl.split(e1)
    x1, x5 = tl.split(o0)
    x3, x7 = tl.split(o1)
    return x0, x1, x2, x3, x4, x5, x6, x7


@triton.jit
def sum16_in_order(lo, hi):
    """``t[0] + t[1] + ... + t[15]`` over the halves ``lo, hi [BM, NB, 8]``, one rounding per add, in order."""
    x0, x1, x2, x3, x4, x5, x6, x7 = unpack8(lo)
    y0, y1, y2, y3, y4, y5, y6, y7 = unpack8(hi)
    s = x0 + x1
    s = s + x2
    s = s + x3
    s = s + x4
    s = s + x5
    s = s + x6
    s = s + x7
    s = s + y0
    s = s + y1
    s = s + y2
    s = s + y3
    s = s + y4
    s = s + y5
    s = s + y6
    s = s + y7
    return s


@triton.jit
def _error(d_lo, d_hi, x_lo, x_hi, MSE: tl.constexpr):
    """4/6 candidate error ``Σ (d − x)²`` or ``Σ |d − x|`` over a block's 16 elements, in index order
    (docs/design.md §2.3), ``[BM, NB]``, from ``|d|`` and ``x``.

    Only magnitudes are needed: ``q`` is negative only for ``x < 0``, and ``fl(−a − x) = −fl(a − |x|)``, so
    ``(d − x)²`` and ``|d − x|`` equal those of ``|d| − |x|`` for every ``x`` (an ``x · enc`` that underflows
    to −0 codes +0 and gives ``0 − x = |x|``, the negation of ``0 − |x|``).
    """
    diff_lo = d_lo - tl.abs(x_lo)
    diff_hi = d_hi - tl.abs(x_hi)
    if MSE:
        return sum16_in_order(diff_lo * diff_lo, diff_hi * diff_hi)
    else:
        return sum16_in_order(tl.abs(diff_lo), tl.abs(diff_hi))


@triton.jit
def _lookup(r, d05, d1, d15, d2, d3, d4, d6):
    """``|d|`` per element ``[BM, NB, 8]`` from its grid magnitude ``r`` and the block's ``d`` per magnitude."""
    d = tl.where(r == 0.5, d05[:, :, None], 0.0)
    d = tl.where(r == 1.0, d1[:, :, None], d)
    d = tl.where(r == 1.5, d15[:, :, None], d)
    d = tl.where(r == 2.0, d2[:, :, None], d)
    d = tl.where(r == 3.0, d3[:, :, None], d)
    d = tl.where(r == 4.0, d4[:, :, None], d)
    return tl.where(r == 6.0, d6[:, :, None], d)


@triton.jit
def block_error_exact(r_lo, r_hi, x_lo, x_hi, sf, amax, C: tl.constexpr, MSE: tl.constexpr):
    """4/6 candidate error for any block, ``|d| = ((r · sf) · amax) / (6E)`` exactly as the spec writes it,
    evaluated once per grid magnitude ``r`` (a block has at most 7 nonzero ones; ``r = 0`` gives 0)."""
    a = amax[:, None]
    c = tl.full(sf.shape, C, tl.float32)
    d05 = tl.div_rn((sf * 0.5) * a, c)
    d1 = tl.div_rn(sf * a, c)
    d15 = tl.div_rn((sf * 1.5) * a, c)
    d2 = tl.div_rn((sf * 2.0) * a, c)
    d3 = tl.div_rn((sf * 3.0) * a, c)
    d4 = tl.div_rn((sf * 4.0) * a, c)
    d6 = tl.div_rn((sf * 6.0) * a, c)
    d_lo = _lookup(r_lo, d05, d1, d15, d2, d3, d4, d6)
    d_hi = _lookup(r_hi, d05, d1, d15, d2, d3, d4, d6)
    return _error(d_lo, d_hi, x_lo, x_hi, MSE)


@triton.jit
def block_error_fast(r_lo, r_hi, x_lo, x_hi, b1, b15, MSE: tl.constexpr):
    """The error of :func:`block_error_exact` from two terms per block (:func:`fast_terms`), for rows where
    :func:`fast_rows` says it is the same.

    A nonzero grid magnitude is ``r = m · 2^j``, ``m ∈ {1, 1.5}``, ``j ∈ {-1..2}``, and ``r · sf`` is exact
    (at most 6 significant bits), so ``|d| = fl(fl(2^j · m · sf · amax) / 6E)``. Rounding commutes with the
    factor ``2^j`` while every value stays a finite normal float32, which the bounds of :func:`fast_rows`
    guarantee; then ``|d| = 2^j · B_m`` with ``B_m = fl(fl(m · sf · amax) / 6E)``, and that product is exact.
    """
    pow_lo = (r_lo.to(tl.int32, bitcast=True) & 0x7F800000).to(tl.float32, bitcast=True)
    pow_hi = (r_hi.to(tl.int32, bitcast=True) & 0x7F800000).to(tl.float32, bitcast=True)
    d_lo = pow_lo * tl.where((r_lo.to(tl.int32, bitcast=True) & 0x400000) != 0, b15[:, :, None], b1[:, :, None])
    d_hi = pow_hi * tl.where((r_hi.to(tl.int32, bitcast=True) & 0x400000) != 0, b15[:, :, None], b1[:, :, None])
    return _error(d_lo, d_hi, x_lo, x_hi, MSE)


@triton.jit
def fast_terms(sf, amax, C: tl.constexpr):
    """``(B_1, B_1.5)`` per block ``[BM, NB]`` for :func:`block_error_fast`: ``B_m = fl(fl(m · sf · amax) / 6E)``.

    The quotient is taken as ``fl32(fl64(y · fl64(1 / 6E)))`` — one float64 product instead of a float32
    division. With ``6E = 1536 = 3 · 2^9`` and ``y = Y · 2^a`` (``Y`` a 24-bit integer), the float32
    result's significand is ``Y · 2^s / 3`` for ``s`` in {1, 2}, whose fraction is 0, 1/3 or 2/3: at least
    1/6 of a float32 ulp from a rounding midpoint, while the float64 product lies within 2^-28 ulp of
    ``y / 6E`` (two roundings of 2^-53). So both round to the same float32 wherever ``B_m`` is a normal
    float32, which :func:`fast_rows` guarantees; ``y = 0`` gives 0 both ways. Checked against float32
    division on every significand by tests/kernels/test_quantize_arithmetic.py.
    """
    tl.static_assert(C == 1536.0, "the float64 quotient is proven for 6E = 1536 (E = 256, as 4/6 uses)")
    inverse = tl.full(sf.shape, 1.0 / C, tl.float64)
    b1 = ((sf * amax[:, None]).to(tl.float64) * inverse).to(tl.float32)
    b15 = (((sf * 1.5) * amax[:, None]).to(tl.float64) * inverse).to(tl.float32)
    return b1, b15


@triton.jit
def fast_rows(amax, row_ok, C: tl.constexpr):
    """Per row of ``amax [BM]``: whether :func:`block_error_fast` is exact on each of its blocks (bool ``[BM]``).

    A block scale is 0 (then every ``d`` is 0 both ways) or in ``[2^-9, 448]``, and rounding is monotone,
    so every block's ``B_1 >= fl(fl(2^-9 · amax) / 6E)`` and every ``fl(1.5 · sf · amax) <= fl(672 · amax)``.
    With the first ``>= 2^-124``, every ``2^j · B_m`` and ``fl(m · sf · amax) · 2^j`` (``j >= -1``) is normal;
    with the second ``<= 2^124``, ``4 · fl(1.5 · sf · amax)`` is finite. An all-zero row (amax 0) has
    only zero scales. Rows outside these bounds (|x| beyond about 2^±100) take the per-magnitude form.
    """
    lowest = tl.div_rn(amax * 0.001953125, tl.full(amax.shape, C, tl.float32))
    return ((lowest >= 2.0**-124) & (amax * 672.0 <= 2.0**124)) | (amax == 0.0) | (row_ok == 0)
