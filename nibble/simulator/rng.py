"""A tiny seeded generator that Python and the page's JavaScript run bit for bit alike.

Mulberry32 (Tommy Ettinger, public domain): 32-bit state, one add and three multiply-xorshift rounds per
draw. Numpy's generators cannot be ported to the browser exactly; this one can (``Math.imul`` and ``>>>``
in ``web/model.js``), so a config and a seed give the same timeline in both. Draws are ``k / 2^32``, exact
doubles in [0, 1).
"""

from __future__ import annotations

import math

MASK32 = 0xFFFFFFFF
GOLDEN = 0x6D2B79F5
# Stream offsets so that the timeline and the dynamics of one seed draw independent numbers.
TIMELINE_STREAM = 0
DYNAMICS_STREAM = 0x5BD1E995


def _imul(a: int, b: int) -> int:
    """32-bit wrapping multiply, as JavaScript's ``Math.imul`` (unsigned result)."""
    return (a * b) & MASK32


class Mulberry32:
    """Seeded uniform draws in [0, 1); ``seed`` is any integer (taken modulo 2^32)."""

    def __init__(self, seed: int, stream: int = TIMELINE_STREAM) -> None:
        self.state = (seed ^ stream) & MASK32

    def uniform(self) -> float:
        self.state = (self.state + GOLDEN) & MASK32
        z = self.state
        z = _imul(z ^ (z >> 15), z | 1)
        z = (z ^ (z + _imul(z ^ (z >> 7), z | 61))) & MASK32
        return ((z ^ (z >> 14)) & MASK32) / 4294967296.0

    def pareto(self, tail: int) -> float:
        """Pareto draw ``X ≥ 1`` with ``P(X > x) = x^-tail``, for ``tail`` 1, 2 or 4 (inverse CDF by ``sqrt``).

        ``u ∈ (0, 1]`` (one minus a draw), so ``X`` is finite.
        """
        u = 1.0 - self.uniform()
        if tail == 1:
            return 1.0 / u
        if tail == 2:
            return 1.0 / math.sqrt(u)
        if tail == 4:
            return 1.0 / math.sqrt(math.sqrt(u))
        raise ValueError(f"tail={tail} is not one of 1, 2, 4")
