"""NVFP4: 16-element blocks of E2M1 codes with E4M3 block scales and a float32 outer scale.

The public entry point :func:`quantize` validates its arguments and runs the reference backend
(plain PyTorch, on whatever device ``x`` lives). DESIGN.md §2.2–2.3 is the normative definition.
"""

from __future__ import annotations

import torch

from .codecs import e2m1_decode, e2m1_rne, e2m1_stochastic, e4m3_rne, pack_e2m1, unpack_e2m1
from .reference import nvfp4 as _reference
from .tensors import NVFP4_BLOCK, NVFP4Tensor
from .validation import check_choice, check_input

SCALES = ("per_tensor", "per_token")
FOUR_OVER_SIX_METRICS = (None, "mse", "mae")
ROUNDINGS = ("nearest", "stochastic")

__all__ = [
    "NVFP4_BLOCK",
    "NVFP4Tensor",
    "e2m1_decode",
    "e2m1_rne",
    "e2m1_stochastic",
    "e4m3_rne",
    "pack_e2m1",
    "quantize",
    "quantize_with_choices",
    "unpack_e2m1",
]


def quantize(
    x: torch.Tensor,
    *,
    scale: str = "per_tensor",
    four_over_six: str | None = None,
    rounding: str = "nearest",
    generator: torch.Generator | None = None,
    validate: bool = True,
) -> NVFP4Tensor:
    """Quantise ``x`` to NVFP4 (DESIGN.md §2.2; four-over-six §2.3).

    Args:
        x: float32, bfloat16 or float16 ``[..., K]`` with ``K % 16 == 0``.
        scale: ``"per_tensor"`` (one outer amax; weights) or ``"per_token"`` (one per row over all
            leading dims; activations, so a token never depends on other tokens of the batch).
        four_over_six: ``None`` for standard NVFP4 (E = 448), or the block-error metric ``"mse"`` /
            ``"mae"`` for adaptive map-to-4/map-to-6 block scaling (E = 256). Source: "Four Over Six"
            (fouroversix) and Transformer Engine's NVFP4 recipe.
        rounding: ``"nearest"`` (ties to even) or ``"stochastic"`` (gradients only; needs ``generator``).
        generator: the explicit random source for stochastic rounding, on ``x``'s device.
        validate: check for NaN/±inf (a device-to-host sync). Hot paths inside a model step pass
            ``False``; the trainer checks loss and gradients for non-finite values once per step.
    The result carries no autograd history (quantisation has no useful derivative; the recipe's
    straight-through gradients live in :mod:`nibble.recipe`).

    Returns:
        :class:`NVFP4Tensor` with codes uint8 ``[..., K//2]``, block scales float8_e4m3fn
        ``[..., K//16]`` and a float32 global decode scale (``[]`` or ``x.shape[:-1]``).
    Raises:
        ValueError: naming the argument, for a non-float dtype, ``K`` not a positive multiple of 16,
            NaN/±inf (when ``validate``), an unknown option, stochastic rounding without a generator
            or combined with four-over-six.
    """
    _check_options(x, scale, four_over_six, rounding, generator, validate)
    tensor, _ = _reference.quantize(
        x.detach(),
        per_token=scale == "per_token",
        four_over_six=four_over_six,
        generator=generator if rounding == "stochastic" else None,
    )
    return tensor


def quantize_with_choices(
    x: torch.Tensor, *, scale: str = "per_tensor", four_over_six: str | None = None, validate: bool = True
) -> tuple[NVFP4Tensor, torch.Tensor]:
    """Like :func:`quantize` (round-to-nearest), also returning which blocks chose map-to-4.

    Returns:
        ``(tensor, map_to_4)`` with ``map_to_4`` bool ``[..., K // 16]`` (all False without 4/6). The
        format itself does not record the choice; this is for statistics such as
        ``nibble_four_over_six_fraction``.
    """
    _check_options(x, scale, four_over_six, "nearest", None, validate)
    return _reference.quantize(x.detach(), per_token=scale == "per_token", four_over_six=four_over_six, generator=None)


def _check_options(
    x: torch.Tensor,
    scale: str,
    four_over_six: str | None,
    rounding: str,
    generator: torch.Generator | None,
    validate: bool,
) -> None:
    check_choice("scale", scale, SCALES)
    check_choice("four_over_six", four_over_six, FOUR_OVER_SIX_METRICS)
    check_choice("rounding", rounding, ROUNDINGS)
    check_input(x, NVFP4_BLOCK, finite=validate)
    if rounding == "nearest" and generator is not None:
        raise ValueError("generator is only used with rounding='stochastic'; drop it or ask for stochastic rounding")
    if rounding == "stochastic":
        if not isinstance(generator, torch.Generator):
            raise ValueError("rounding='stochastic' needs generator=torch.Generator(...) (reproducibility)")
        if generator.device.type != x.device.type:
            raise ValueError(f"generator is on {generator.device}, x on {x.device}; put them on one device")
        if four_over_six is not None:
            raise ValueError(
                f"four_over_six={four_over_six!r} cannot be combined with rounding='stochastic' "
                "(4/6 compares round-to-nearest candidates; stochastic rounding is for gradients)"
            )
