"""The fragment layout (:mod:`nibble.kernels.fragments`) built by one Triton kernel on the GPU: what lets a
weight quantised afresh in every forward (the trainer's) reach the fragment GEMMs without a slow
rearrangement (benchmarks/results/h200_fragment_layout.log: 128 µs for an 8192 × 7168 weight).

Each program fills a block of output words; every word gathers the four bytes its operand registers read
(rows ``grp`` and ``grp + 8`` of its column group, bytes ``2c`` and ``2c + 1`` of its block) and moves each
code's bits to :data:`nibble.kernels.fragments.REGISTER_BITS` (written out in the kernel). Integer work
only: the same words as the PyTorch construction, checked bit for bit under Triton's interpreter and on
the H200.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from ..fragments import COLUMN_GROUP, QUAD

_WORDS_PER_PROGRAM = 1024


@triton.jit
def _place(byte, m0: tl.constexpr, m1: tl.constexpr, m2: tl.constexpr, s: tl.constexpr, shift: tl.constexpr):
    """The code in bits ``shift … shift + 3`` of ``byte``: its magnitude bits to ``m0, m1, m2`` and its sign to
    ``s``."""
    code = byte >> shift
    return ((code & 1) << m0) | (((code >> 1) & 1) << m1) | (((code >> 2) & 1) << m2) | (((code >> 3) & 1) << s)


@triton.jit
def _fragment_words_kernel(
    codes_ptr,
    words_ptr,
    total,
    N,
    HALF_K,
    GROUPS,
    QUADS,
    BLOCK: tl.constexpr,
):
    """``words[e, g, q, lane, j]`` (int32, flat index ``i``) from ``codes [E, N, K / 2]`` (uint8). The bit
    positions are :data:`~nibble.kernels.fragments.REGISTER_BITS`, written out (the CPU tests compare)."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = i < total
    j = i % 4
    lane = (i // 4) % 32
    q = (i // 128) % QUADS
    g = (i // (128 * QUADS)) % GROUPS
    e = i // (128 * QUADS * GROUPS)
    grp = lane // 4
    c = lane % 4
    byte = (4 * q + j) * 8 + 2 * c  # of the register pair a0a1 / a2a3; a4a5 / a6a7 read the next byte
    row = g * 16 + grp
    # register r reads row grp + 8 (r mod 2), byte 2c + r // 2 of the block: low nibble, then high nibble
    b0 = _load(codes_ptr, e, row, byte, N, HALF_K, ok)
    b1 = _load(codes_ptr, e, row + 8, byte, N, HALF_K, ok)
    b2 = _load(codes_ptr, e, row, byte + 1, N, HALF_K, ok)
    b3 = _load(codes_ptr, e, row + 8, byte + 1, N, HALF_K, ok)
    word = _place(b0, 9, 10, 11, 15, 0) | _place(b0, 25, 26, 27, 31, 4)
    word |= _place(b1, 6, 7, 8, 12, 0) | _place(b1, 22, 23, 24, 28, 4)
    word |= _place(b2, 0, 1, 2, 13, 0) | _place(b2, 16, 17, 18, 29, 4)
    word |= _place(b3, 3, 4, 5, 14, 0) | _place(b3, 19, 20, 21, 30, 4)
    tl.store(words_ptr + i, word, mask=ok)


@triton.jit
def _load(codes_ptr, e, row, byte, N, HALF_K, ok):
    valid = ok & (row < N) & (byte < HALF_K)
    return tl.load(codes_ptr + (e * N + row) * HALF_K + byte, mask=valid, other=0).to(tl.int32)


def fragment_words(codes: torch.Tensor) -> torch.Tensor:
    """int32 ``[E, G, Q, 32, 4]`` words of the fragment layout from uint8 codes ``[E, N, K / 2]`` (CUDA, or the
    CPU under Triton's interpreter)."""
    e, n, half_k = codes.shape
    groups, quads = -(-n // COLUMN_GROUP), -(-(2 * half_k) // QUAD)
    words = torch.empty(e, groups, quads, 32, 4, dtype=torch.int32, device=codes.device)
    total = words.numel()
    grid = (triton.cdiv(total, _WORDS_PER_PROGRAM),)
    with torch.cuda.device(codes.device) if codes.is_cuda else contextlib.nullcontext():
        _fragment_words_kernel[grid](
            codes.contiguous(), words, total, n, half_k, groups, quads, BLOCK=_WORDS_PER_PROGRAM
        )
    return words
