"""The sampler form of a packed NVFP4 weight: its codes and block scales rearranged, once, into the register
layout of the tensor-core instruction that consumes them (:mod:`nibble.kernels.gpu.fragment_gemm`).

A decode-size product is bound by reading the weight; read row by row, every 16-element block would have to
be spread over four threads on each step. Here each thread finds its part of four consecutive blocks in
one 16-byte word, already in the order the instruction wants, and turns each 32-bit word into its four
float16 operand registers with one to three integer operations each (Marlin-style kernels pre-shuffle
their weights for the same reason).

Layout, for a weight ``[E, N, K]`` (``[N, K]`` is ``E = 1``) padded with zero codes and scales to
``N16 = ceil(N / 16) * 16`` rows and ``K64 = ceil(K / 64) * 64`` columns:

- ``words``: int32 ``[E, N16 / 16, K64 / 64, 32, 4]``: column group ``g`` (weight rows ``16g … 16g + 15``),
  quad ``q`` (blocks ``4q … 4q + 3``), lane ``l = 4 * grp + c``, block ``j`` of the quad. The word holds the
  eight E2M1 codes ``(row, element)`` = ``(16g + grp, 4c … 4c + 3)`` and ``(16g + grp + 8, 4c … 4c + 3)`` of
  block ``4q + j`` — the A fragment of ``mma.m16n8k16`` with block element ``4c + i`` in k-slot
  ``2c + i`` (``i < 2``) or ``2c + 8 + i - 2``. Operand register ``r`` (``a0a1``: row ``grp``, elements
  ``4c, 4c+1``; ``a2a3``: row ``grp + 8``, the same; ``a4a5`` and ``a6a7``: elements ``4c+2, 4c+3``)
  keeps its two codes at :data:`REGISTER_BITS` ``[r]``: magnitude bits, then the sign bit, of the low and
  the high float16.
- ``scales``: uint8 ``[E, N16 / 16, K64 / 64, 8, 8]``: for ``grp`` and block ``j`` of the quad, bytes
  ``2j`` and ``2j + 1`` are the E4M3 block scales of rows ``grp`` and ``grp + 8``.

Any permutation of a block's elements gives the same product bits (docs/design.md §2.6: a block's partial
product is exact), so the kernel's choice of k-slots is free.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NVFP4_BLOCK = 16
QUAD = 4 * NVFP4_BLOCK  # elements of K per 16-byte word
COLUMN_GROUP = 16  # weight rows per tensor-core tile

# For operand register r: (low magnitude bits, low sign bit, high magnitude bits, high sign bit) in the word.
# Register 0 sits where the float16 pair wants it (magnitudes under the exponent, bits 9-11 and 25-27; signs
# on bits 15 and 31); register 1 is it shifted right by 3; registers 2 and 3 fill the remaining bits so that
# one multiply moves magnitudes and signs together without carries into kept bits.
REGISTER_BITS = (
    ((9, 10, 11), 15, (25, 26, 27), 31),
    ((6, 7, 8), 12, (22, 23, 24), 28),
    ((0, 1, 2), 13, (16, 17, 18), 29),
    ((3, 4, 5), 14, (19, 20, 21), 30),
)


@dataclass(frozen=True)
class NVFP4Fragments:
    """A packed NVFP4 weight in the tensor-core fragment layout (see the module docstring).

    Attributes:
        words: int32 ``[E, G, Q, 32, 4]``.
        scales: uint8 ``[E, G, Q, 8, 8]``.
        n: the weight's rows ``N`` (before padding to ``16 G``).
        k: the weight's columns ``K`` (before padding to ``64 Q``).
    """

    words: torch.Tensor
    scales: torch.Tensor
    n: int
    k: int

    @property
    def nbytes(self) -> int:
        """Bytes held by the words and scales (the codes' and block scales' size, plus padding)."""
        return self.words.numel() * 4 + self.scales.numel()


def mismatch(fragments: object, codes: torch.Tensor, block_scales: torch.Tensor) -> str | None:
    """Why ``fragments`` is not the layout of ``codes [..., N, K/2]`` and ``block_scales`` (another type,
    device, dtype or shape), or None when it is. Shapes only: whether the contents are current is the
    business of whoever overwrote the codes (:func:`nibble.kernels.gemm.refresh_fragments`)."""
    if not isinstance(fragments, NVFP4Fragments):
        return f"fragments must be NVFP4Fragments, got {type(fragments).__name__}"
    e = codes.shape[0] if codes.dim() == 3 else 1
    n, k = codes.shape[-2], 2 * codes.shape[-1]
    groups, quads = -(-n // COLUMN_GROUP), -(-k // QUAD)
    expected = ((e, groups, quads, 32, 4), torch.int32), ((e, groups, quads, 8, 8), torch.uint8)
    got = (tuple(fragments.words.shape), fragments.words.dtype), (tuple(fragments.scales.shape), fragments.scales.dtype)
    if (fragments.n, fragments.k) != (n, k) or got != expected or block_scales.shape[-1] * NVFP4_BLOCK != k:
        return f"fragments of a [{fragments.n}, {fragments.k}] weight {got} do not fit codes {tuple(codes.shape)}"
    if fragments.words.device != codes.device or fragments.scales.device != codes.device:
        return f"fragments on {fragments.words.device}, codes on {codes.device}"
    return None


def element_order() -> tuple[torch.Tensor, torch.Tensor]:
    """For each of the 32 lanes × 4 operand registers × 2 halves: the (row within the column group, element
    within the block) whose code it holds. int64 ``[32, 4, 2]`` each."""
    lane = torch.arange(32).view(32, 1, 1)
    grp, c = lane // 4, lane % 4
    register = torch.arange(4).view(1, 4, 1)
    half = torch.arange(2).view(1, 1, 2)
    row = grp + 8 * (register % 2)
    element = 4 * c + 2 * (register // 2) + half
    return row.expand(32, 4, 2), element.expand(32, 4, 2)


def _bit_tables() -> tuple[torch.Tensor, torch.Tensor]:
    """int32 ``[4, 2, 3]`` magnitude bit positions and ``[4, 2]`` sign bit positions per register and half."""
    magnitude = torch.tensor([[r[0], r[2]] for r in REGISTER_BITS], dtype=torch.int32)
    sign = torch.tensor([[r[1], r[3]] for r in REGISTER_BITS], dtype=torch.int32)
    return magnitude, sign


def to_fragments(codes: torch.Tensor, block_scales: torch.Tensor) -> NVFP4Fragments:
    """The fragment layout of packed codes ``[..., N, K/2]`` (uint8) and E4M3 block scales ``[..., N, K/16]``
    (one leading expert dim or none), on their device.

    Raises:
        ValueError: codes that are not uint8 ``[E, N, K/2]`` or ``[N, K/2]``, or scales of another shape.
    """
    if codes.dtype != torch.uint8 or codes.dim() not in (2, 3) or codes.shape[-1] % 8 or 0 in codes.shape:
        got = f"{codes.dtype} {tuple(codes.shape)}"
        raise ValueError(
            f"fragments: codes must be uint8 [N, K/2] or [E, N, K/2] with K % 16 == 0, not empty; got {got}"
        )
    stack = codes if codes.dim() == 3 else codes.unsqueeze(0)
    scales = block_scales.view(torch.uint8)
    scales = scales if scales.dim() == 3 else scales.unsqueeze(0)
    e, n, half_k = stack.shape
    k = 2 * half_k
    if tuple(scales.shape) != (e, n, k // NVFP4_BLOCK):
        raise ValueError(f"fragments: block scales {tuple(scales.shape)} do not match codes {tuple(stack.shape)}")
    groups, quads = -(-n // COLUMN_GROUP), -(-k // QUAD)
    device = stack.device
    if device.type == "cuda":
        from .gpu.fragment_layout import fragment_words  # imports triton

        words = fragment_words(stack)
    else:
        words = reference_words(stack)
    padded_scales = torch.zeros(e, groups * COLUMN_GROUP, quads * 4, dtype=torch.uint8, device=device)
    padded_scales[:, :n, : k // NVFP4_BLOCK] = scales
    s = padded_scales.reshape(e, groups, 2, 8, quads, 4)  # [E, G, half, grp, Q, j]
    frag_scales = s.permute(0, 1, 4, 3, 5, 2).reshape(e, groups, quads, 8, 8)
    return NVFP4Fragments(words, frag_scales.contiguous(), n, k)


def reference_words(stack: torch.Tensor) -> torch.Tensor:
    """The words of the layout from codes ``[E, N, K / 2]`` with PyTorch operations: the CPU path, and the
    reference the GPU construction (:func:`nibble.kernels.gpu.fragment_layout.fragment_words`) is tested
    against."""
    e, n, half_k = stack.shape
    groups, quads = -(-n // COLUMN_GROUP), -(-2 * half_k // QUAD)
    device = stack.device
    row, element = (t.to(device) for t in element_order())
    magnitude_bits, sign_bits = (t.to(device) for t in _bit_tables())
    words = torch.empty(e, groups, quads, 32, 4, dtype=torch.int32, device=device)
    per = max(1, 2**22 // (groups * COLUMN_GROUP * quads * QUAD))  # experts at a time: bounded temporaries
    for first in range(0, e, per):
        chunk = stack[first : first + per]
        padded = torch.zeros(chunk.shape[0], groups * COLUMN_GROUP, quads * QUAD // 2, dtype=torch.uint8, device=device)
        padded[:, :n, :half_k] = chunk
        nibbles = torch.stack((padded & 0xF, padded >> 4), dim=-1)
        nibbles = nibbles.reshape(-1, groups, COLUMN_GROUP, quads, 4, NVFP4_BLOCK)
        # [E', G, Q, 4 (block j), 32 (lane), 4 (register), 2 (half)]: the code each register half holds
        picked = nibbles.permute(0, 1, 3, 4, 2, 5)[..., row, element].to(torch.int32)
        fields = ((picked >> 3) & 1) << sign_bits
        for bit in range(3):
            fields |= ((picked >> bit) & 1) << magnitude_bits[..., bit]
        word = torch.zeros(fields.shape[:-2], dtype=torch.int32, device=device)
        for register in range(4):
            for half in range(2):
                word |= fields[..., register, half]
        words[first : first + per] = word.permute(0, 1, 2, 4, 3)  # [E', G, Q, lane, block j]
    return words
