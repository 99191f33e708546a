"""NVFP4 quantisation in plain PyTorch, following DESIGN.md §2.2–2.3 operation by operation.

Each arithmetic step below is one float32 IEEE operation on tensors of the same device (no Python
scalar divisions, no reductions whose order matters), so CPU and CUDA runs give identical bits.
"""

from __future__ import annotations

import torch

from ..codecs import e2m1_decode, e2m1_rne, e2m1_stochastic, e4m3_rne, pack_e2m1
from ..tensors import NVFP4_BLOCK, NVFP4Tensor

E_STANDARD = 448.0
E_FOUR_OVER_SIX = 256.0
# Below this amax a tensor/row is treated as all zeros: S = 6E/amax would overflow float32 or push
# sf * g into the subnormal range, where GPUs flush to zero (DESIGN.md §2.2 step 2).
AMAX_FLOOR = 2.0**-100


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
        per_token: one outer scale per row (all leading dims) instead of one for the tensor.
        four_over_six: ``None``, ``"mse"`` or ``"mae"``: the 4/6 block-error metric.
        generator: stochastic rounding of elements when given, round-to-nearest-even otherwise.
    Returns:
        The :class:`NVFP4Tensor` and a bool ``[..., K // 16]`` mask of blocks that chose map-to-4.
    """
    xf = x.to(torch.float32)
    blocks = xf.reshape(*xf.shape[:-1], xf.shape[-1] // NVFP4_BLOCK, NVFP4_BLOCK)
    bmax = blocks.abs().amax(dim=-1)  # [..., nb]
    amax = _outer_amax(bmax, per_token)
    e = E_FOUR_OVER_SIX if four_over_six else E_STANDARD
    zero_outer = amax < AMAX_FLOOR
    encode_scale = torch.where(zero_outer, torch.ones_like(amax), torch.full_like(amax, e * 6.0) / amax)
    decode_scale = torch.ones_like(encode_scale) / encode_scale
    per_block = (lambda t: t.unsqueeze(-1)) if per_token else (lambda t: t)

    block_over_6 = bmax / torch.full_like(bmax, 6.0)
    sf = e4m3_rne(block_over_6 * per_block(encode_scale))
    codes = _encode(blocks, sf, per_block(decode_scale), generator)
    map_to_4 = torch.zeros_like(bmax, dtype=torch.bool)
    if four_over_six:
        sf4 = e4m3_rne(1.5 * block_over_6 * per_block(encode_scale))
        codes4 = _encode(blocks, sf4, per_block(decode_scale), None)
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
    """E2M1 codes ``[..., nb, 16]`` of ``blocks`` under block scales ``sf`` (step 4 of §2.2)."""
    sf32 = sf.to(torch.float32)
    denom = sf32 * decode_scale
    zero_block = sf32 == 0
    # A zero-scale block would divide by zero; its reciprocal is unused (codes forced to +0 below).
    recip = torch.ones_like(denom) / torch.where(zero_block, torch.ones_like(denom), denom)
    scaled = blocks * recip.unsqueeze(-1)
    codes = e2m1_rne(scaled) if generator is None else e2m1_stochastic(scaled, generator)
    return torch.where(zero_block.unsqueeze(-1), torch.zeros_like(codes), codes)


def _block_error(
    codes: torch.Tensor, sf: torch.Tensor, amax: torch.Tensor, blocks: torch.Tensor, e: float, metric: str
) -> torch.Tensor:
    """4/6 candidate error per block (§2.3): Σ|d − x| or Σ(d − x)², summed in element order."""
    d = e2m1_decode(codes) * sf.to(torch.float32).unsqueeze(-1)
    d = d * amax.unsqueeze(-1)
    d = d / torch.full_like(d, 6.0 * e)
    diff = d - blocks
    per_element = diff * diff if metric == "mse" else diff.abs()
    total = per_element[..., 0]
    for i in range(1, NVFP4_BLOCK):
        total = total + per_element[..., i]
    return total
