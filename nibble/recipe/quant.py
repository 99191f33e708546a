"""Quantise-dequantise of weights and activations under a precision plan (the forward's operands).

Weights are always quantised from their bf16 cast (docs/design.md §3), so the trainer's forward,
weight-sync and checkpoint export see exactly the same bytes. Expert stacks ``[E, N, K]`` get one
outer scale per expert: quantising the flattened ``[E, N*K]`` per row is bit-identical to quantising
each expert per tensor (the 16-element blocks and the amax are the same).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from nibble.kernels import MXFP8Tensor, NVFP4Tensor, gemm, mxfp8, nvfp4
from nibble.recipe.plan import PrecisionPlan

QuantizedWeight = NVFP4Tensor | MXFP8Tensor


def quantize_weight(weight: torch.Tensor, fmt: str, plan: PrecisionPlan) -> QuantizedWeight:
    """Quantise a weight ``[N, K]`` (one outer scale) or an expert stack ``[E, N, K]`` (one per expert).

    The input is cast to bf16 first; ``fmt`` is ``"nvfp4"`` or ``"mxfp8"``.
    """
    w = weight.detach().to(torch.bfloat16)
    if fmt == "mxfp8":
        return mxfp8.quantize(w, validate=False)
    if w.dim() == 2:
        return nvfp4.quantize(w, scale="per_tensor", four_over_six=plan.four_over_six, validate=False)
    flat = nvfp4.quantize(
        w.reshape(w.shape[0], -1), scale="per_token", four_over_six=plan.four_over_six, validate=False
    )
    return NVFP4Tensor(
        codes=flat.codes.reshape(*w.shape[:-1], w.shape[-1] // 2),
        block_scales=flat.block_scales.reshape(*w.shape[:-1], w.shape[-1] // nvfp4.NVFP4_BLOCK),
        global_scale=flat.global_scale,
        four_over_six=flat.four_over_six,
        shape=w.shape,
    )


def sampler_form(q: QuantizedWeight) -> QuantizedWeight:
    """What a sampler keeps of a quantised weight: on CUDA an NVFP4 weight also carries the tensor-core
    fragment layout that the decode-size GEMM reads (:func:`nibble.kernels.gemm.with_fragments`), made
    once here rather than on every step; anything else unchanged."""
    if isinstance(q, NVFP4Tensor) and q.codes.is_cuda:
        return gemm.with_fragments(q)
    return q


def refresh_sampler_form(q: QuantizedWeight) -> None:
    """After ``q``'s codes and scales were overwritten in place (a weight update), bring its fragment layout up
    to date, in place."""
    if isinstance(q, NVFP4Tensor):
        gemm.refresh_fragments(q)


def quantize_weights_together(weights: Sequence[torch.Tensor], plan: PrecisionPlan) -> list[NVFP4Tensor]:
    """NVFP4 weights ``[N_i, K]`` (one ``K``) quantised with ONE global scale: that of their concatenation
    along the output dim, which is what an engine computes with after fusing them (``gate_up_proj``).

    Blocks never straddle two weights (a block is 16 elements of one row), so slicing the concatenation's
    codes and block scales gives each weight exactly the codes a fused GEMM decodes. Returns one
    :class:`NVFP4Tensor` per input, all holding the same scalar ``global_scale``.

    Raises:
        ValueError: fewer than two weights, a weight that is not 2-D, or differing ``K``, naming the shapes.
    """
    shapes = [tuple(w.shape) for w in weights]
    if len(shapes) < 2 or any(len(s) != 2 for s in shapes) or len({s[1] for s in shapes}) != 1:
        raise ValueError(f"weights quantised together must be two or more [N, K] with one K, got {shapes}")
    fused = quantize_weight(torch.cat([w.detach() for w in weights]), "nvfp4", plan)
    out, start = [], 0
    for rows, k in shapes:
        stop = start + rows
        out.append(
            NVFP4Tensor(
                codes=fused.codes[start:stop],
                block_scales=fused.block_scales[start:stop],
                global_scale=fused.global_scale,
                four_over_six=fused.four_over_six,
                shape=torch.Size((rows, k)),
            )
        )
        start = stop
    return out


def quantize_activation(
    x: torch.Tensor, fmt: str, plan: PrecisionPlan, *, gemm_operand: bool = False
) -> QuantizedWeight:
    """Quantise activations ``[..., K]``: NVFP4 with the plan's activation scale (per token), or MXFP8.

    ``gemm_operand``: NVFP4 activations about to enter the GPU GEMMs also carry the operand those read
    (:attr:`nibble.kernels.NVFP4Tensor.operand`), written by the same kernel; the same bits either way.
    """
    if fmt == "mxfp8":
        return mxfp8.quantize(x, validate=False)
    return nvfp4.quantize(
        x, scale=plan.activation_scale, four_over_six=plan.four_over_six, validate=False, gemm_operand=gemm_operand
    )


def fake_quantize(t: torch.Tensor, fmt: str, plan: PrecisionPlan) -> torch.Tensor:
    """Quantise-dequantise ``t [..., K]`` along its last dim, zero-padding K to the block size.

    Used for the ``quantized`` backward, whose gradient GEMMs contract over dims (tokens, output
    features) that need not be multiples of the block; zeros do not change a block's amax or sum.
    """
    block = mxfp8.MXFP8_BLOCK if fmt == "mxfp8" else nvfp4.NVFP4_BLOCK
    k = t.shape[-1]
    padded = F.pad(t, (0, -k % block)) if k % block else t
    out = quantize_activation(padded, fmt, plan).dequantize(t.dtype)
    return out[..., :k]
