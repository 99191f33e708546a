"""NVFP4: 16-element blocks of E2M1 codes with E4M3 block scales and a float32 outer scale.

The public entry points validate their arguments and run a backend (:mod:`nibble.kernels.backend`): the
Triton kernels for CUDA tensors, the plain-PyTorch reference elsewhere, with identical bits.
docs/design.md §2.2–2.3 is the normative definition.
"""

from __future__ import annotations

import torch

from . import backend as _backend
from .codecs import e2m1_decode, e2m1_rne, e2m1_stochastic, e4m3_rne, pack_e2m1, unpack_e2m1
from .reference import nvfp4 as _reference
from .tensors import NVFP4_BLOCK, NVFP4Tensor
from .validation import check_choice, check_input, check_output_dtype

SCALES = ("per_tensor", "per_token")
FOUR_OVER_SIX_METRICS = (None, "mse", "mae")
ROUNDINGS = ("nearest", "stochastic")

__all__ = [
    "NVFP4_BLOCK",
    "NVFP4Tensor",
    "dequantize",
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
    backend: str | None = None,
    gemm_operand: bool = False,
) -> NVFP4Tensor:
    """Quantise ``x`` to NVFP4 (docs/design.md §2.2; four-over-six §2.3).

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
        backend: ``None`` (Triton on CUDA, reference elsewhere), ``"reference"`` or ``"triton"``; stochastic
            rounding always runs on the reference.
        gemm_operand: on the Triton backend, also write the decoded operand the GPU GEMMs read
            (:attr:`NVFP4Tensor.operand`) from the same kernel, for activations about to enter
            :func:`nibble.kernels.gemm.matmul`: 2 more bytes per element written, one decode launch fewer.
            Ignored by the reference backend, whose products decode in float64.
    The result carries no autograd history (quantisation has no useful derivative; the recipe's
    straight-through gradients live in :mod:`nibble.recipe`).

    Returns:
        :class:`NVFP4Tensor` with codes uint8 ``[..., K//2]``, block scales float8_e4m3fn
        ``[..., K//16]`` and a float32 global decode scale (``[]`` or ``x.shape[:-1]``).
    Raises:
        ValueError: naming the argument, for a non-float dtype, ``K`` not a positive multiple of 16,
            NaN/±inf (when ``validate``), an unknown option, stochastic rounding without a generator
            or combined with four-over-six or with ``backend="triton"``, a backend that cannot run here.
    """
    _check_options(x, scale, four_over_six, rounding, generator, validate)
    if rounding == "stochastic":
        if backend == "triton":
            raise ValueError("rounding='stochastic' runs on backend='reference' only (it is for gradients)")
        per_token = scale == "per_token"
        return _reference.quantize(x.detach(), per_token=per_token, four_over_six=None, generator=generator)[0]
    tensor, _ = _run(x, scale, four_over_six, backend, with_choices=False, gemm_operand=gemm_operand)
    return tensor


def quantize_with_choices(
    x: torch.Tensor,
    *,
    scale: str = "per_tensor",
    four_over_six: str | None = None,
    validate: bool = True,
    backend: str | None = None,
) -> tuple[NVFP4Tensor, torch.Tensor]:
    """Like :func:`quantize` (round-to-nearest), also returning which blocks chose map-to-4.

    Returns:
        ``(tensor, map_to_4)`` with ``map_to_4`` bool ``[..., K // 16]`` (all False without 4/6). The
        format itself does not record the choice; this is for statistics such as
        ``nibble_four_over_six_fraction``.
    """
    _check_options(x, scale, four_over_six, "nearest", None, validate)
    return _run(x, scale, four_over_six, backend, with_choices=True)


def dequantize(tensor: NVFP4Tensor, dtype: torch.dtype = torch.float32, *, backend: str | None = None) -> torch.Tensor:
    """Decode ``tensor`` to a dense ``tensor.shape`` tensor of ``dtype`` (float32 arithmetic, one cast);
    the same bits as :meth:`NVFP4Tensor.dequantize`, on the chosen backend.

    Raises:
        ValueError: ``dtype`` is not a floating-point dtype, or the backend cannot run here.
    """
    if _backend.resolve(tensor.device, backend) == "reference":
        return tensor.dequantize(dtype)
    check_output_dtype(dtype)
    from .gpu import nvfp4 as _gpu

    return _gpu.dequantize(tensor, dtype)


def _run(
    x: torch.Tensor,
    scale: str,
    four_over_six: str | None,
    backend: str | None,
    *,
    with_choices: bool,
    gemm_operand: bool = False,
) -> tuple[NVFP4Tensor, torch.Tensor | None]:
    per_token = scale == "per_token"
    if _backend.resolve(x.device, backend) == "reference":
        return _reference.quantize(x.detach(), per_token=per_token, four_over_six=four_over_six, generator=None)
    from .gpu import nvfp4 as _gpu  # imports triton: only where it runs

    return _gpu.quantize(
        x.detach(), per_token=per_token, four_over_six=four_over_six, with_choices=with_choices, operand=gemm_operand
    )


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
