"""Argument checks shared by the public quantisers: every failure is a ValueError naming the argument."""

from __future__ import annotations

from collections.abc import Iterable

import torch

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_choice(name: str, value: object, allowed: Iterable[object]) -> None:
    """Raise ``ValueError`` unless ``value`` is one of ``allowed``."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not one of {', '.join(repr(a) for a in allowed)}")


def check_input(x: object, block: int, *, finite: bool) -> None:
    """Validate a tensor about to be block-quantised.

    Raises:
        ValueError: ``x`` is not a tensor, has no dimensions, is not float32/bfloat16/float16, its last
            dimension ``K`` is not a positive multiple of ``block``, or (when ``finite``) it holds NaN/±inf.
    """
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"x has dtype {x.dtype}; expected one of float32, bfloat16, float16 (cast it first)")
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension (the block dimension K), got a 0-dim tensor")
    k = x.shape[-1]
    if k == 0 or k % block:
        raise ValueError(
            f"x has last dimension K={k} (shape {tuple(x.shape)}); K must be a positive multiple of {block}"
        )
    if finite and x.numel() and not bool(torch.isfinite(x).all()):
        bad = (~torch.isfinite(x)).nonzero()[0].tolist()
        raise ValueError(f"x holds NaN or ±inf (first at index {bad}); quantisation needs finite inputs")


def check_output_dtype(dtype: object) -> None:
    """Raise ``ValueError`` unless ``dtype`` is a floating-point ``torch.dtype`` to decode into."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point or dtype.itemsize == 1:
        raise ValueError(f"dtype={dtype!r}: dequantize needs a floating-point torch.dtype such as torch.float32")
