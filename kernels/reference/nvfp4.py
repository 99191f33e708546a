"""NVFP4 quantisation in plain PyTorch, following docs/design.md §2.2–2.3 operation by operation.

docs/design.md fixes Transformer Engine 2.20.2's reference quantiser (``NVFP4QuantizerRef``) as normative:
its float32 operations, in its order. Each step below is one float32 IEEE operation on tensors of the
same device (no Python scalar divisions, no reductions whose order matters), so CPU and CUDA runs give
identical bits.
"""

from __future__ import annotations

import torch

from ..codecs import e2m1_decode, e2m1_rne, e2m1_stochastic, e4m3_rne, pack_e2m1
from ..tensors import NVFP4_BLOCK, NVFP4Tensor

E_STANDARD = 448.0
E_FOUR_OVER_SIX = 256.0
E2M1_MAX = 6.0
FLT_MAX = torch.finfo(torch.float32).max


def quantize(
    x: torch.Tensor,
    *,
    per_token: bool,
    four_over_six: str | None,
    generator: torch.Generator | None,
) -> tuple[NVFP4Tensor, torch.Tensor]:
    """Quantise a validated float tensor ``[..., K]`` to NVFP4.

    Args:
        x: float32/bfloat16/float16 ``[..., K]``, ``K % 16 == 0``, finite (checked by the caller).
        per_token: one outer scale per row (all leading dims) instead of one for the tensor (TE's
            ``row_scaled_nvfp4``).
        four_over_six: ``None``, ``"mse"`` or ``"mae"``: the 4/6 block-error metric (TE's
            ``nvfp4_use_4over6`` with ``nvfp4_e4m3_max=256``).
        generator: stochastic rounding of elements when given, round-to-nearest-even otherwise.
    Returns:
        The :class:`NVFP4Tensor` and a bool ``[..., K // 16]`` mask of blocks that chose map-to-4.
    """
    xf = x.to(torch.float32)
    blocks = xf.reshape(*xf.shape[:-1], xf.shape[-1] // NVFP4_BLOCK, NVFP4_BLOCK)
    bmax = blocks.abs().amax(dim=-1)  # [..., nb]
    amax = _outer_amax(bmax, per_token)
    e = E_FOUR_OVER_SIX if four_over_six else E_STANDARD
    encode_scale = global_encode_scale(amax, e)
    decode_scale = torch.ones_like(encode_scale) / encode_scale
    per_block = (lambda t: t.unsqueeze(-1)) if per_token else (lambda t: t)
    s = per_block(encode_scale)
    g = per_block(decode_scale)

    map_to_4 = torch.zeros_like(bmax, dtype=torch.bool)
    if not four_over_six:
        multiplier = s * (torch.ones_like(s) / torch.full_like(s, E2M1_MAX))  # S · fl(1/6), as TE folds it
        sf = e4m3_rne(torch.clamp(bmax * multiplier, max=FLT_MAX))
        codes = _encode(blocks, sf, g, generator)
    else:
        base = bmax / torch.full_like(bmax, E2M1_MAX) * s
        sf = e4m3_rne(base)
        sf4 = e4m3_rne(base * 1.5)
        codes = _encode(blocks, sf, g, None)
        codes4 = _encode(blocks, sf4, g, None)
        outer = per_block(amax)
        err6 = _block_error(codes, sf, outer, blocks, e, four_over_six)
        err4 = _block_error(codes4, sf4, outer, blocks, e, four_over_six)
        map_to_4 = err4 < err6  # ties keep map-to-6
        sf = torch.where(map_to_4, sf4, sf)
        codes = torch.where(map_to_4.unsqueeze(-1), codes4, codes)

    tensor = NVFP4Tensor(
        codes=pack_e2m1(codes.reshape(xf.shape)),
        block_scales=sf,
        global_scale=decode_scale,
        four_over_six=bool(four_over_six),
        shape=xf.shape,
    )
    return tensor, map_to_4


def global_encode_scale(amax: torch.Tensor, e: float) -> torch.Tensor:
    """The outer encode scale ``S = min((6 E) / amax, FLT_MAX)``, 1 where that is 0 (docs/design.md §2.2 step 2).

    Args:
        amax: float32 ``[]`` or ``[M]``, non-negative. An all-zero tensor or row (amax 0) gets
            ``S = FLT_MAX`` and so a decode scale ``1 / S = 2^-128``, a float32 subnormal.
        e: the E4M3 range the scales target: 448, or 256 with four-over-six.
    Returns:
        float32 tensor shaped like ``amax``. Source: TE 2.20.2 ``NVFP4QuantizerRef``.
    """
    s = torch.full_like(amax, e * E2M1_MAX) / amax
    s = torch.clamp(s, max=FLT_MAX)
    return torch.where(s == 0, torch.ones_like(s), s)


def _outer_amax(bmax: torch.Tensor, per_token: bool) -> torch.Tensor:
    """Max of |x| per row (``[...]``) or over the whole tensor (``[]``); 0 for an empty tensor."""
    if per_token:
        return bmax.amax(dim=-1)
    if bmax.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=bmax.device)
    return bmax.amax()


def _encode(
    blocks: torch.Tensor, sf: torch.Tensor, decode_scale: torch.Tensor, generator: torch.Generator | None
) -> torch.Tensor:
    """E2M1 codes ``[..., nb, 16]`` of ``blocks`` under block scales ``sf`` (step 4 of §2.2).

    A zero block scale makes ``1 / (sf · g)`` infinite; TE saturates it at FLT_MAX, so nonzero elements
    of such a block code as ±6 or near it (they still decode to ±0).
    """
    denom = sf.to(torch.float32) * decode_scale
    encode = torch.clamp(torch.ones_like(denom) / denom, max=FLT_MAX)
    scaled = torch.clamp(blocks * encode.unsqueeze(-1), -E2M1_MAX, E2M1_MAX)
    return e2m1_rne(scaled) if generator is None else e2m1_stochastic(scaled, generator)


def _block_error(
    codes: torch.Tensor, sf: torch.Tensor, amax: torch.Tensor, blocks: torch.Tensor, e: float, metric: str
) -> torch.Tensor:
    """4/6 candidate error per block (§2.3): Σ|d − x| or Σ(d − x)², summed in element order."""
    d = e2m1_decode(codes) * sf.to(torch.float32).unsqueeze(-1)
    d = d * amax.unsqueeze(-1)
    d = d / torch.full_like(d, E2M1_MAX * e)
    diff = d - blocks
    per_element = diff * diff if metric == "mse" else diff.abs()
    total = per_element[..., 0]
    for i in range(1, NVFP4_BLOCK):
        total = total + per_element[..., i]
    return total
