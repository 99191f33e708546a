"""docs/design.md §2.2–2.3 (TE's convention) written out literally in NumPy float32, as an independent second
implementation.

NumPy evaluates each float32 array operation with one IEEE rounding and never fuses a multiply-add, so
this follows the spec's operation order exactly. Rounding to E4M3/E2M1 is done by nearest-value search
over the format's full value table (ties to the even code), not by the comparisons the library uses.
"""

from __future__ import annotations

import numpy as np

F = np.float32


def _e4m3_table() -> tuple[np.ndarray, np.ndarray]:
    values, codes = [], []
    for code in range(0x7F):  # positive finite E4M3 codes (0x7F is NaN)
        exponent, mantissa = code >> 3, code & 7
        value = mantissa / 8 * 2.0**-6 if exponent == 0 else (1 + mantissa / 8) * 2.0 ** (exponent - 7)
        values.append(value)
        codes.append(code)
    return np.array(values, dtype=np.float64), np.array(codes)


E4M3_VALUES, E4M3_CODES = _e4m3_table()
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _nearest_even(magnitude: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Index of the nearest table value; on a tie the index with an even last bit."""
    dist = np.abs(magnitude[..., None].astype(np.float64) - table)
    best = dist.min(axis=-1, keepdims=True)
    candidates = dist == best
    even = candidates & (np.arange(len(table)) % 2 == 0)
    choose = np.where(even.any(axis=-1, keepdims=True), even, candidates)
    return choose.argmax(axis=-1)


def e4m3(x: np.ndarray) -> np.ndarray:
    """float32 -> nearest E4M3 value (as float32), saturating at 448."""
    mag = np.minimum(np.abs(x), F(448))
    return (np.sign(x) * E4M3_VALUES[_nearest_even(mag, E4M3_VALUES)]).astype(F)


def e2m1_codes(v: np.ndarray) -> np.ndarray:
    """Sign bit for ``v < 0`` only: an exact −0.0 codes as +0 (docs/design.md §2.1)."""
    mag = np.minimum(np.abs(v), F(6))
    return _nearest_even(mag, E2M1_VALUES) | ((v < 0).astype(np.int64) << 3)


def e2m1_value(codes: np.ndarray) -> np.ndarray:
    return (np.where(codes >> 3, -1.0, 1.0) * E2M1_VALUES[codes & 7]).astype(F)


def quantize(x: np.ndarray, *, per_token: bool, four_over_six: str | None):
    """Rows ``x`` float32 ``[M, K]``: returns (codes [M, K] unpacked, sf [M, K/16] float32, g, map_to_4)."""
    x = x.astype(F)
    m, k = x.shape
    blocks = x.reshape(m, k // 16, 16)
    bmax = np.abs(blocks).max(axis=-1)
    amax = bmax.max(axis=-1, keepdims=True) if per_token else np.full((1, 1), bmax.max(), dtype=F)
    e = F(256) if four_over_six else F(448)
    flt_max = np.finfo(F).max
    with np.errstate(divide="ignore"):
        s = np.minimum((e * F(6)) / amax, flt_max).astype(F)
    s = np.where(s == 0, F(1), s).astype(F)
    g = (F(1) / s).astype(F)

    def encode(sf):
        denom = (sf * g).astype(F)
        with np.errstate(divide="ignore"):
            enc = np.minimum(F(1) / denom, flt_max).astype(F)
        with np.errstate(over="ignore"):
            scaled = np.clip((blocks * enc[..., None]).astype(F), F(-6), F(6))
        return e2m1_codes(scaled)

    def error(codes, sf):
        d = ((e2m1_value(codes) * sf[..., None]).astype(F) * amax[..., None]).astype(F)
        d = (d / (F(6) * e)).astype(F)
        diff = (d - blocks).astype(F)
        per = (diff * diff).astype(F) if four_over_six == "mse" else np.abs(diff)
        total = per[..., 0]
        for i in range(1, 16):
            total = (total + per[..., i]).astype(F)
        return total

    choice = np.zeros(bmax.shape, dtype=bool)
    if not four_over_six:
        multiplier = (s * (F(1) / F(6))).astype(F)
        sf = e4m3(np.minimum((bmax * multiplier).astype(F), flt_max))
        codes = encode(sf)
    else:
        base = ((bmax / F(6)).astype(F) * s).astype(F)
        sf6, sf4 = e4m3(base), e4m3((base * F(1.5)).astype(F))
        codes6, codes4 = encode(sf6), encode(sf4)
        choice = error(codes4, sf4) < error(codes6, sf6)
        sf = np.where(choice, sf4, sf6)
        codes = np.where(choice[..., None], codes4, codes6)
    return codes.reshape(m, k), sf, g.reshape(-1) if per_token else g.reshape(()), choice
