"""Argument checks shared by the RL modules: each failure is a ValueError naming the argument."""

from __future__ import annotations

import math

import torch


def describe(value) -> str:
    """``float32[2, 3]`` for a tensor, the type name otherwise (for error messages)."""
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
    return type(value).__name__


def check_floating(name: str, value, shape: torch.Size | None = None, dim: int | None = None) -> None:
    """A floating tensor of ``shape`` (or of ``dim`` dimensions)."""
    ok = isinstance(value, torch.Tensor) and value.dtype.is_floating_point
    ok = ok and (shape is None or value.shape == shape) and (dim is None or value.dim() == dim)
    if not ok:
        expected = list(shape) if shape is not None else f"a {dim}-D tensor" if dim is not None else "a tensor"
        raise ValueError(f"{name}: expected floating {expected}, got {describe(value)}")


def check_mask(name: str, value, shape: torch.Size) -> None:
    """A bool tensor of ``shape``."""
    if not isinstance(value, torch.Tensor) or value.dtype != torch.bool or value.shape != shape:
        raise ValueError(f"{name}: expected bool{list(shape)}, got {describe(value)}")


def check_number(name: str, value, *, low: float, high: float = math.inf, high_open: bool = False) -> None:
    """A finite real number (not a bool) in ``[low, high]`` (or ``[low, high)``)."""
    is_real = isinstance(value, int | float) and not isinstance(value, bool)
    inside = is_real and math.isfinite(value) and low <= value and (value < high if high_open else value <= high)
    if not inside:
        bound = f"[{low}, {high})" if high_open else f"[{low}, {high}]"
        raise ValueError(f"{name}={value!r} must be a finite number in {bound}")


def check_choice(name: str, value, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {', '.join(choices)}")
