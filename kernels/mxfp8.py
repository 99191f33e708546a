"""MXFP8 (OCP Microscaling v1.0): 32-element blocks of E4M3 elements with a power-of-two E8M0 scale.

docs/design.md §2.4 is the normative definition. Exponents are computed exactly from the float's exponent
and mantissa (``torch.frexp``), never with a floating-point ``log2``.
"""

from __future__ import annotations

import torch

from .codecs import e4m3_rne
from .tensors import MXFP8_BLOCK, MXFP8Tensor
from .validation import check_choice, check_input

SCALE_MODES = ("rceil", "floor")
_E8M0_BIAS = 127

__all__ = ["MXFP8_BLOCK", "MXFP8Tensor", "quantize"]


def quantize(x: torch.Tensor, *, scale_mode: str = "rceil", validate: bool = True) -> MXFP8Tensor:
    """Quantise ``x`` to MXFP8.

    Args:
        x: float32, bfloat16 or float16 ``[..., K]`` with ``K % 32 == 0``.
        scale_mode: ``"rceil"`` (default; cuBLAS and Transformer Engine): the smallest ``e`` with
            ``bmax / 2^e <= 448``; ``"floor"`` (OCP spec): ``e = floor(log2(bmax)) - 8``. Both are
            clamped to [-127, 127]; an all-zero block gets ``e = -127``.
        validate: check for NaN/±inf (a device-to-host sync).
    The result carries no autograd history.

    Returns:
        :class:`MXFP8Tensor`: elements float8_e4m3fn ``[..., K]`` (saturated at ±448), block scales
        float8_e8m0fnu ``[..., K // 32]``.
    Raises:
        ValueError: naming the argument, for a non-float dtype, ``K`` not a positive multiple of 32,
            NaN/±inf (when ``validate``) or an unknown ``scale_mode``.
    """
    check_choice("scale_mode", scale_mode, SCALE_MODES)
    check_input(x, MXFP8_BLOCK, finite=validate)
    xf = x.detach().to(torch.float32)
    blocks = xf.reshape(*xf.shape[:-1], xf.shape[-1] // MXFP8_BLOCK, MXFP8_BLOCK)
    bmax = blocks.abs().amax(dim=-1)
    exponent = _block_exponent(bmax, scale_mode)
    # Multiply by 2^-e rather than divide by 2^e: for e in [-127, 120] (the reachable range) 2^-e is a
    # normal float32, whereas 2^e = 2^-127 is subnormal and would be flushed to zero on a GPU.
    elements = e4m3_rne(blocks * _exact_pow2(-exponent).unsqueeze(-1)).reshape(xf.shape)
    biased = (exponent + _E8M0_BIAS).to(torch.uint8)
    return MXFP8Tensor(elements=elements, block_scales=biased.view(torch.float8_e8m0fnu), scale_mode=scale_mode)


def _block_exponent(bmax: torch.Tensor, scale_mode: str) -> torch.Tensor:
    """Shared exponent per block, int32 ``[..., nb]`` (docs/design.md §2.4)."""
    mantissa, exp = torch.frexp(bmax)  # bmax = mantissa * 2^exp, mantissa in [0.5, 1)
    exp = exp.to(torch.int32)
    if scale_mode == "floor":
        e = exp - 9  # floor(log2(bmax)) = exp - 1
    else:
        # 448 = 0.875 * 2^9, so bmax <= 448 * 2^e  <=>  e >= exp - 9 (+1 when mantissa > 0.875).
        e = exp - 9 + (mantissa > 0.875).to(torch.int32)
    e = e.clamp(-_E8M0_BIAS, _E8M0_BIAS)
    return torch.where(bmax == 0, torch.full_like(e, -_E8M0_BIAS), e)


def _exact_pow2(k: torch.Tensor) -> torch.Tensor:
    """``2.0**k`` as float32 for int32 ``k`` in [-126, 127], built from the exponent bits (exact)."""
    return ((k + 127) << 23).to(torch.int32).view(torch.float32)
