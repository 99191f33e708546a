"""Element codecs shared by the block formats: E2M1 (FP4) and E4M3 (FP8) rounding, E2M1 packing.

Everything here is elementwise and exact in float32 (docs/design.md §2): rounding decisions are made by
comparisons against exactly representable midpoints, never by arithmetic that could round twice.
"""

from __future__ import annotations

import torch

E2M1_MAX = 6.0
E4M3_MAX = 448.0

# Decoded value of each 4-bit E2M1 code (bit 3 sign, bits 2-1 exponent, bit 0 mantissa), OCP MX v1.0.
_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)

# Magnitude code = number of thresholds passed. A tie at a midpoint goes to the code with an even
# mantissa bit: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4. "Strict" midpoints round
# down on the tie (the lower neighbour is the even one), the others round up.
_E2M1_MIDPOINTS_STRICT = (0.25, 1.25, 2.5, 5.0)  # code += 1 only when |v| > midpoint
_E2M1_MIDPOINTS_INCLUSIVE = (0.75, 1.75, 3.5)  # code += 1 when |v| >= midpoint

_E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def e2m1_values(device: torch.device | str = "cpu") -> torch.Tensor:
    """The 16 decoded E2M1 values indexed by code: float32 ``[16]`` (code 8 is −0.0)."""
    return torch.tensor(_E2M1_VALUES, dtype=torch.float32, device=device)


def e2m1_rne(x: torch.Tensor) -> torch.Tensor:
    """Round to E2M1 codes: clamp to [−6, 6], nearest grid point, ties to the even code.

    Args:
        x: float32 tensor of any shape, already divided by its block's scale. NaN is not expected
            (callers validate); it would encode as +0.
    Returns:
        uint8 tensor of the same shape holding one unpacked 4-bit code per element (0..15). The sign
        bit is set for ``x < 0``, as Transformer Engine decides it: small negatives that round to zero
        give 0b1000 (−0), an exact −0.0 gives 0b0000.

    Source: docs/design.md §2.1 (grid and ties of the OCP Microscaling Formats v1.0 spec, FP4 E2M1).
    """
    mag = x.abs()
    code = torch.zeros(x.shape, dtype=torch.uint8, device=x.device)
    for midpoint in _E2M1_MIDPOINTS_STRICT:
        code += (mag > midpoint).to(torch.uint8)
    for midpoint in _E2M1_MIDPOINTS_INCLUSIVE:
        code += (mag >= midpoint).to(torch.uint8)
    return code | ((x < 0).to(torch.uint8) << 3)


def e2m1_stochastic(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Stochastically round to E2M1 codes (unbiased inside [−6, 6]).

    ``|x|`` is clamped to 6, then rounded up to the next grid point with probability equal to its
    fractional distance from the lower neighbour, so ``E[value(code)] = clamp(x, -6, 6)``. The sign
    bit is set as in :func:`e2m1_rne`.

    Args:
        x: float32 tensor of any shape (already scaled).
        generator: the explicit random source, on ``x``'s device; the draw is one uniform per element.
    Returns:
        uint8 codes, same shape as ``x``.
    """
    grid = torch.tensor(_E2M1_GRID, dtype=torch.float32, device=x.device)
    mag = x.abs().clamp(max=E2M1_MAX)
    lower = (torch.bucketize(mag, grid, right=True) - 1).clamp(0, len(_E2M1_GRID) - 2)
    lo, hi = grid[lower], grid[lower + 1]
    p_up = (mag - lo) / (hi - lo)
    u = torch.rand(x.shape, generator=generator, device=x.device, dtype=torch.float32)
    code = (lower + (u < p_up).to(lower.dtype)).to(torch.uint8)
    return code | ((x < 0).to(torch.uint8) << 3)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """Decode unpacked E2M1 codes (uint8, values 0..15, any shape) to float32 of the same shape."""
    return e2m1_values(codes.device)[codes.long()]


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """Pack unpacked E2M1 codes two per byte: element ``2i`` in the low nibble, ``2i+1`` in the high.

    Args:
        codes: uint8 ``[..., K]`` with ``K`` even and values 0..15.
    Returns:
        uint8 ``[..., K // 2]`` (the ModelOpt / compressed-tensors / torchao ``pack_uint4`` layout).
    Raises:
        ValueError: if the last dimension is odd or the dtype is not uint8.
    """
    if codes.dtype != torch.uint8:
        raise ValueError(f"pack_e2m1: codes must be uint8, got {codes.dtype}")
    if codes.dim() == 0 or codes.shape[-1] % 2:
        raise ValueError(f"pack_e2m1: last dimension must be even, got shape {tuple(codes.shape)}")
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_e2m1`: uint8 ``[..., K // 2]`` -> uint8 codes ``[..., K]``."""
    if packed.dtype != torch.uint8:
        raise ValueError(f"unpack_e2m1: packed must be uint8, got {packed.dtype}")
    low, high = packed & 0x0F, packed >> 4
    return torch.stack((low, high), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def e4m3_rne(x: torch.Tensor) -> torch.Tensor:
    """Round float32 to ``float8_e4m3fn`` to nearest, ties to even, saturating at ±448.

    E4M3 (OCP FP8, "fn": no infinities) has 3 mantissa bits and subnormals down to 2^-9; values below
    half of that round to zero. PyTorch's cast implements exactly this rounding (the same c10 routine
    on CPU and CUDA); the clamp first turns what would be an overflow to NaN into saturation.

    Args:
        x: float32 tensor, any shape, finite.
    Returns:
        float8_e4m3fn tensor of the same shape.
    """
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
