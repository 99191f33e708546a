"""The bit-exact contract, checked: Nibble's quantisation against Transformer Engine's reference and against
Nibble's other backends, part by part (docs/design.md §2)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import nvfp4
from .codecs import unpack_e2m1
from .te_reference import TEReference

PARTS = ("codes", "block_scales", "global_scale", "map_to_4")


@dataclass(frozen=True)
class Agreement:
    """How many entries of each part differ between two quantisations of one tensor, and of how many.

    ``parts`` maps each of :data:`PARTS` to ``(differing, total)``, compared bitwise (−0.0 ≠ +0.0).
    """

    parts: dict[str, tuple[int, int]]

    @property
    def identical(self) -> bool:
        return all(differ == 0 for differ, _ in self.parts.values())

    def describe(self) -> str:
        """``"identical"`` or the differing parts, e.g. ``"block_scales 124/16384"``."""
        if self.identical:
            return "identical"
        return ", ".join(f"{part} {d}/{n}" for part, (d, n) in self.parts.items() if d)


def with_te(
    te: TEReference, x: torch.Tensor, *, scale: str, four_over_six: str | None, backend: str | None = None
) -> Agreement:
    """Nibble (on ``x``'s device, ``backend`` as :func:`nibble.kernels.nvfp4.quantize`) against TE's reference
    run on the CPU copy of ``x [M, K]``.

    Raises:
        ValueError: as :func:`nibble.kernels.nvfp4.quantize` for bad input (NaN/inf, ``K % 16 != 0``, ...).
    """
    q, choice = nvfp4.quantize_with_choices(x, scale=scale, four_over_six=four_over_six, backend=backend)
    ref = te.quantize(x.cpu(), scale=scale, four_over_six=four_over_six)
    theirs = (ref.codes, ref.block_scales, ref.global_scale.view(torch.int32), ref.map_to_4)
    return _agreement(_parts(q, choice), theirs)


def between_backends(x: torch.Tensor, device: str, backend: str, *, scale: str, four_over_six: str | None) -> Agreement:
    """Nibble's CPU reference on ``x`` against ``backend`` (``"reference"`` or ``"triton"``) on ``device``."""
    cpu = nvfp4.quantize_with_choices(x.cpu(), scale=scale, four_over_six=four_over_six, backend="reference")
    other = nvfp4.quantize_with_choices(x.to(device), scale=scale, four_over_six=four_over_six, backend=backend)
    return _agreement(_parts(*cpu), _parts(*other))


def _parts(q: nvfp4.NVFP4Tensor, map_to_4: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (
        unpack_e2m1(q.codes).cpu(),
        q.block_scales.cpu().view(torch.uint8),
        q.global_scale.cpu().view(torch.int32),
        map_to_4.cpu(),
    )


def _agreement(ours: tuple[torch.Tensor, ...], theirs: tuple[torch.Tensor, ...]) -> Agreement:
    parts = {}
    for name, a, b in zip(PARTS, ours, theirs, strict=True):
        if a.shape != b.shape:
            raise RuntimeError(f"{name}: shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be compared")
        parts[name] = (int((a != b).sum()), a.numel())
    return Agreement(parts)
